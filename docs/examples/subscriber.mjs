// A subscriber in Node.js (npm `zeromq` v6), written from docs/protocol.md alone: it decodes
// every kind (det, pose, pose3d, face, clip, preview, stats, meta) and prints one JSON line
// each.
//
//   cd docs/examples && npm ci
//   node docs/examples/subscriber.mjs tcp://127.0.0.1:5560 [--seconds S] [--count N]
//
// It stops after S seconds or N messages, or on Ctrl-C / SIGTERM, exiting 0 each way.
// With CURVE (docs/security.md), set sock.curveServerKey, sock.curvePublicKey and
// sock.curveSecretKey (Z85 strings from the key files) before connect().
import { endianness } from "node:os";
import { Subscriber } from "zeromq";

const args = process.argv.slice(2);
const endpoint = args.find((a) => !a.startsWith("--")) ?? "tcp://127.0.0.1:5560";
const option = (name) => {
  const i = args.indexOf(name);
  return i >= 0 ? Number(args[i + 1]) : undefined;
};
const seconds = option("--seconds");
const count = option("--count");

const TYPED = {
  uint8: Uint8Array, int8: Int8Array, uint16: Uint16Array, int16: Int16Array,
  uint32: Uint32Array, int32: Int32Array, int64: BigInt64Array,
  float32: Float32Array, float64: Float64Array,
};
const GETTER = {
  uint8: "getUint8", int8: "getInt8", uint16: "getUint16", int16: "getInt16",
  uint32: "getUint32", int32: "getInt32", int64: "getBigInt64",
  float32: "getFloat32", float64: "getFloat64",
};
const NATIVE = endianness() === "LE" ? "little" : "big";

// One binary part -> a typed array of prod(shape) values, as its descriptor says.
function decodePart(desc, buf) {
  const Typed = TYPED[desc.dtype];
  if (!Typed) throw new Error(`${desc.name}: unknown dtype ${desc.dtype}`);
  const n = desc.shape.reduce((a, b) => a * b, 1);
  if (buf.length !== n * Typed.BYTES_PER_ELEMENT) {
    throw new Error(`${desc.name}: ${buf.length} bytes, shape ${desc.shape} needs ${n * Typed.BYTES_PER_ELEMENT}`);
  }
  if (Typed.BYTES_PER_ELEMENT === 1 || desc.byteorder === NATIVE) {
    // a copy: Node's Buffers share pooled memory at offsets a typed array may not start at
    return new Typed(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.length));
  }
  const view = new DataView(buf.buffer, buf.byteOffset, buf.length);
  const out = new Typed(n);
  for (let i = 0; i < n; i++) out[i] = view[GETTER[desc.dtype]](i * Typed.BYTES_PER_ELEMENT, desc.byteorder === "little");
  return out;
}

// A JPEG's (height, width) from its SOF marker, or null.
function jpegSize(bytes) {
  if (bytes[0] !== 0xff || bytes[1] !== 0xd8) return null;
  for (let i = 2; i + 9 < bytes.length; ) {
    if (bytes[i] !== 0xff) return null;
    const marker = bytes[i + 1];
    const length = (bytes[i + 2] << 8) | bytes[i + 3];
    if (marker >= 0xc0 && marker <= 0xc3) {
      return [(bytes[i + 5] << 8) | bytes[i + 6], (bytes[i + 7] << 8) | bytes[i + 8]];
    }
    i += 2 + length;
  }
  return null;
}

// The first values (NaN prints as null), the sum of the finite ones and how many are not
// finite (pose3d marks points not triangulated with NaN).
function summary(values) {
  const head = Array.from(values.slice(0, 6), Number);
  let sum = 0;
  let nonfinite = 0;
  for (const v of values) {
    const x = Number(v);
    if (Number.isFinite(x)) sum += x;
    else nonfinite += 1;
  }
  return { n: values.length, head, sum, nonfinite };
}

const sock = new Subscriber({ receiveHighWaterMark: 1000 });
sock.connect(endpoint);
sock.subscribe(); // every topic; e.g. sock.subscribe("pose/") for one kind
let meta = null;
let received = 0;
if (seconds !== undefined) setTimeout(() => sock.close(), seconds * 1000).unref();
for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => sock.close());

try {
  for await (const [topicBuf, headerBuf, ...raw] of sock) {
    const topic = topicBuf.toString("utf8");
    const text = headerBuf.toString("utf8");
    const h = JSON.parse(text); // capture_ts/publish_ts lose digits here: use the _str forms
    const capture = BigInt(h.capture_ts_str);
    const publish = BigInt(h.publish_ts_str);
    // the exact integer as it stands in the JSON text is the string form's value
    const exact = text.match(/"capture_ts":(\d+)/)[1] === h.capture_ts_str;
    if (h.parts.length !== raw.length) {
      console.error(`skipped ${topic}: ${h.parts.length} parts described, ${raw.length} sent`);
      continue;
    }
    const arrays = {};
    h.parts.forEach((desc, i) => { arrays[desc.name] = decodePart(desc, raw[i]); });
    const line = {
      topic, kind: h.kind, camera: h.camera, seq: h.seq,
      capture_ts: capture.toString(), publish_ts: publish.toString(), ts_exact: exact,
      lag_ms: Number(publish - capture) / 1e6,
      parts: Object.fromEntries(h.parts.map((d) => [d.name, { dtype: d.dtype, shape: d.shape, ...summary(arrays[d.name]) }])),
    };
    if (h.kind === "meta") {
      meta = h.meta;
      const p = meta.pose;
      line.meta = {
        keypoints: p.count,
        rigs: meta.rigs ?? [],
        pose3d_columns: meta.pose3d?.columns ?? null,
        consistent: p.names.length === p.count && p.group_of.length === p.count
          && p.skeleton.every(([a, b, g]) => a < p.count && b < p.count && p.groups.some((x) => x.name === g)),
        colours: Object.fromEntries(p.groups.map((g) => [g.name, g.color])),
      };
    } else if (h.kind === "pose") {
      // keypoints [K, 3] as (x, y, score): the names and skeleton come from meta
      const k = arrays.keypoints;
      const nose = meta ? meta.pose.names.indexOf("nose") : -1;
      line.pose = {
        track_id: h.track_id, count: h.count, meta_count: meta ? meta.pose.count : null,
        nose: nose >= 0 ? [k[3 * nose], k[3 * nose + 1], k[3 * nose + 2]] : null,
        since_previous_ms: h.since_previous_ms,
      };
    } else if (h.kind === "pose3d") {
      // points [P, K, 4] (x, y, z in m, confidence; NaN where not triangulated), error [P, K]
      // px, used [P, K, V] (V = h.cameras): person p's keypoint k is at 4 (p K + k)
      const [P, K] = h.parts[0].shape;
      const V = h.cameras.length;
      const pts = arrays.points;
      const people = h.person_ids.map((id, p) => {
        let triangulated = 0;
        let views = 0;
        for (let k = 0; k < K; k++) {
          if (Number.isFinite(pts[4 * (p * K + k)])) triangulated += 1;
          for (let v = 0; v < V; v++) views += arrays.used[(p * K + k) * V + v];
        }
        return { id, tracks: h.tracks[p], triangulated, views };
      });
      line.pose3d = {
        rig: h.rig, cameras: h.cameras, count: h.count, P, keypoints: h.keypoints,
        meta_count: meta ? meta.pose.count : null, views: h.views, missing: h.missing,
        skew_ms: h.skew_ms, skew_ns: h.skew_ns, people,
        rig_cameras: meta ? (meta.rigs ?? []).find((r) => r.rig === h.rig)?.cameras ?? null : null,
      };
    } else if (h.kind === "det") {
      line.det = { width: h.width, height: h.height, labels: h.labels, track_ids: h.track_ids ?? null };
    } else if (h.kind === "face") {
      line.face = { identity: h.identity, similarity: h.similarity, reason: h.reason, track_id: h.track_id };
    } else if (h.kind === "clip") {
      line.clip = { top_label: h.top_label, labels: h.labels, track_id: h.track_id };
    } else if (h.kind === "preview") {
      line.preview = { width: h.width, height: h.height, jpeg_size: jpegSize(arrays.jpeg) };
    } else if (h.kind === "stats") {
      line.stats = { cameras: Object.keys(h.stats.cameras), uptime_s: h.stats.uptime_s };
    }
    console.log(JSON.stringify(line));
    if (count !== undefined && ++received >= count) break;
  }
} finally {
  sock.close();
}
