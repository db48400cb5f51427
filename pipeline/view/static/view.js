// npucam view: decodes the messages the server relays (the wire contract, docs/protocol.md)
// and draws each camera: the latest preview frame, and over it the det boxes of that frame
// (joined by seq), track ids, each track's latest pose as its skeleton coloured by keypoint
// group (from the `meta` message), face identities with their similarity, CLIP labels, and
// the camera's fps, lag, drops by reason and device busy from `stats`. Each rig's latest
// pose3d message is drawn as 3D skeletons in an orthographic view of the calibration's world
// (drag to turn it, wheel to zoom; ?up=z, -y or y names the world's up axis, default z).

const PERSON_COLOUR = "#ffeb3b";
const FACE_COLOUR = "#00e5ff";
const params = new URLSearchParams(location.search);
const MIN_SCORE = Number(params.get("min_score") ?? 0.3); // keypoints drawn above this
const WIDTH = 640; // canvas width in px; the height keeps the frame's aspect
const DETS_KEPT = 64; // det messages kept per camera to join a frame by seq
const POSE_KEEP_MS = 3000; // a track's pose is drawn this long after it arrived
const LIVE_KEEP_MS = 500; // a per-frame ("live") pose replaces the track's keyframe this long
const SOURCE_ABSENT = 0; // a live pose's `source` column (docs/protocol.md)
const LABEL_KEEP_MS = 10000; // face identities and CLIP labels
const FRAME_FRESH_MS = 2000; // older frames: boxes follow the latest det instead
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
const UP = params.get("up") ?? "z"; // the world axis drawn up: z (a board on the floor), -y, y
const RIG_WIDTH = 480;
const RIG_HEIGHT = 360;
const POSE3D_KEEP_MS = 5000; // a rig's people are drawn this long after their message
const BODY_COLOUR = "#ffffff"; // a rig person's fitted body (body/<rig>), over the pose3d points

const DTYPES = {
  uint8: [Uint8Array, "getUint8"], int8: [Int8Array, "getInt8"],
  uint16: [Uint16Array, "getUint16"], int16: [Int16Array, "getInt16"],
  uint32: [Uint32Array, "getUint32"], int32: [Int32Array, "getInt32"],
  int64: [BigInt64Array, "getBigInt64"],
  float32: [Float32Array, "getFloat32"], float64: [Float64Array, "getFloat64"],
};

// One relayed message: u32 n, n u32 lengths, then [topic, header JSON, *parts] (little end).
export function decode(buffer) {
  const view = new DataView(buffer);
  const n = view.getUint32(0, true);
  let offset = 4 * (n + 1);
  const raw = [];
  for (let i = 0; i < n; i++) {
    const length = view.getUint32(4 * (i + 1), true);
    raw.push(new Uint8Array(buffer, offset, length));
    offset += length;
  }
  if (n < 2 || offset !== buffer.byteLength) throw new Error("not a relayed message");
  const text = new TextDecoder();
  const topic = text.decode(raw[0]);
  const header = JSON.parse(text.decode(raw[1]));
  const descs = header.parts ?? [];
  if (descs.length !== n - 2) throw new Error(`${topic}: ${descs.length} parts described, ${n - 2} sent`);
  const arrays = {};
  descs.forEach((d, i) => { arrays[d.name] = decodePart(topic, d, raw[i + 2]); });
  return { topic, header, arrays };
}

function decodePart(topic, d, bytes) {
  const entry = DTYPES[d.dtype];
  if (!entry) throw new Error(`${topic}: ${d.name}: unknown dtype ${d.dtype}`);
  const [Ctor, getter] = entry;
  const count = d.shape.reduce((a, b) => a * b, 1);
  if (bytes.byteLength !== count * Ctor.BYTES_PER_ELEMENT) {
    throw new Error(`${topic}: ${d.name}: ${bytes.byteLength} bytes for shape ${d.shape}`);
  }
  let data;
  if (Ctor.BYTES_PER_ELEMENT === 1 || (d.byteorder === "little") === LITTLE_ENDIAN) {
    data = new Ctor(bytes.slice().buffer); // a copy starts aligned
  } else {
    const v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    data = new Ctor(count);
    for (let i = 0; i < count; i++) data[i] = v[getter](i * Ctor.BYTES_PER_ELEMENT, d.byteorder === "little");
  }
  return { data, shape: d.shape, encoding: d.encoding };
}

// Exact lag in ms from the string forms of the ns timestamps (numbers lose the last digits).
function lagMs(h) {
  return Number(BigInt(h.publish_ts_str) - BigInt(h.capture_ts_str)) / 1e6;
}

const state = { meta: null, cameras: new Map(), rigs: new Map(), stats: null, synthetic: new Set(), view: null };

class Camera {
  constructor(name) {
    this.name = name;
    this.section = document.createElement("section");
    this.section.className = "camera";
    this.section.dataset.camera = name;
    const title = document.createElement("h2");
    title.textContent = name;
    const stack = document.createElement("div");
    stack.className = "stack";
    this.frameCanvas = document.createElement("canvas");
    this.frameCanvas.className = "frame";
    this.overlay = document.createElement("canvas");
    this.overlay.className = "overlay";
    stack.append(this.frameCanvas, this.overlay);
    this.statsBox = document.createElement("div");
    this.statsBox.className = "stats";
    this.section.append(title, stack, this.statsBox);
    document.getElementById("waiting")?.remove();
    const main = document.getElementById("cameras");
    const after = [...main.children].find((c) => c.dataset.camera > name);
    main.insertBefore(this.section, after ?? null);
    this.frame = null; // {bitmap, seq, width, height, at}
    this.frameDirty = false;
    this.dets = new Map(); // seq -> det message
    this.latestDet = null;
    this.poses = new Map(); // track id -> {keypoints, count, at}: Sapiens2's keyframes
    this.livePoses = new Map(); // track id -> {keypoints, count, source, age, at}: per frame
    this.faces = new Map(); // track id -> {identity, similarity, reason, at}
    this.untrackedFaces = []; // face messages without a track: [{msg, at}]
    this.clips = new Map(); // track id, or "frame" -> {label, probability, at}
    this.counts = { frames: 0, boxes: 0, skeletons: 0, liveSkeletons: 0, renders: 0 };
    this.lastDrawn = { boxes: 0, skeletons: 0, liveSkeletons: 0 };
  }

  det(msg) {
    this.dets.set(msg.header.seq, msg);
    if (this.dets.size > DETS_KEPT) this.dets.delete(this.dets.keys().next().value);
    if (!this.latestDet || msg.header.seq >= this.latestDet.header.seq) this.latestDet = msg;
  }

  // The det drawn: the shown frame's own (joined by seq), else the latest one before it;
  // the latest det when there is no recent frame.
  detToDraw(now) {
    if (!this.frame || now - this.frame.at > FRAME_FRESH_MS) return this.latestDet;
    const own = this.dets.get(this.frame.seq);
    if (own) return own;
    let best = null;
    for (const [seq, msg] of this.dets) if (seq <= this.frame.seq && (!best || seq > best.header.seq)) best = msg;
    return best ?? this.latestDet;
  }
}

// One rig's 3D view: the latest pose3d message, turned by dragging.
class Rig {
  constructor(name) {
    this.name = name;
    this.section = document.createElement("section");
    this.section.className = "camera rig";
    this.section.dataset.rig = name;
    const title = document.createElement("h2");
    title.textContent = `rig ${name} (3D)`;
    this.canvas = document.createElement("canvas");
    this.canvas.className = "rig3d";
    this.canvas.width = RIG_WIDTH;
    this.canvas.height = RIG_HEIGHT;
    this.statsBox = document.createElement("div");
    this.statsBox.className = "stats";
    this.section.append(title, this.canvas, this.statsBox);
    document.getElementById("waiting")?.remove();
    document.getElementById("rigs").append(this.section);
    this.msg = null;
    this.at = 0;
    this.yaw = -0.6; // radians about the up axis
    this.pitch = 0.35; // radians above the horizon
    this.zoom = 1;
    this.counts = { messages: 0, skeletons: 0, renders: 0, points: 0, bodies: 0 };
    this.body = null; // the latest body/<rig> message
    this.bodyAt = 0;
    let drag = null;
    this.canvas.addEventListener("pointerdown", (e) => {
      drag = { x: e.clientX, y: e.clientY };
      this.canvas.setPointerCapture(e.pointerId);
    });
    this.canvas.addEventListener("pointermove", (e) => {
      if (!drag) return;
      this.yaw += (e.clientX - drag.x) * 0.01;
      this.pitch = Math.max(-1.5, Math.min(1.5, this.pitch + (e.clientY - drag.y) * 0.01));
      drag = { x: e.clientX, y: e.clientY };
      scheduleRender();
    });
    this.canvas.addEventListener("pointerup", () => { drag = null; });
    this.canvas.addEventListener("wheel", (e) => {
      e.preventDefault();
      this.zoom = Math.max(0.2, Math.min(10, this.zoom * Math.exp(-e.deltaY * 0.001)));
      scheduleRender();
    }, { passive: false });
  }

  update(msg, now) {
    this.msg = msg;
    this.at = now;
    this.counts.messages += 1;
  }
}

function rig(name) {
  let r = state.rigs.get(name);
  if (!r) {
    r = new Rig(name);
    state.rigs.set(name, r);
  }
  return r;
}

// World (x, y, z) -> (right, depth, up) for the chosen up axis.
function worldAxes(x, y, z) {
  if (UP === "-y") return [x, z, -y];
  if (UP === "y") return [x, -z, y];
  return [x, y, z];
}

function renderRig(r, now) {
  const g = r.canvas.getContext("2d");
  const W = r.canvas.width;
  const H = r.canvas.height;
  g.fillStyle = "#000";
  g.fillRect(0, 0, W, H);
  const msg = r.msg && now - r.at <= POSE3D_KEEP_MS ? r.msg : null;
  const pm = state.meta?.pose;
  const people = [];
  if (msg && pm) {
    const [P, K] = msg.arrays.points.shape;
    const pts = msg.arrays.points.data;
    for (let p = 0; p < P && K === pm.count; p++) {
      const points = [];
      for (let k = 0; k < K; k++) {
        const o = 4 * (p * K + k);
        const ok = Number.isFinite(pts[o]) && pts[o + 3] > 0;
        points.push(ok ? worldAxes(pts[o], pts[o + 1], pts[o + 2]) : null);
      }
      people.push({ id: msg.header.person_ids[p], points });
    }
  }
  // centre on the people (or the origin), scale to fit 2 m or their extent
  const all = people.flatMap((q) => q.points.filter((v) => v));
  const centre = [0, 1, 2].map((i) => (all.length ? all.reduce((a, v) => a + v[i], 0) / all.length : 0));
  let extent = 2;
  for (const v of all) for (let i = 0; i < 3; i++) extent = Math.max(extent, 2 * Math.abs(v[i] - centre[i]));
  const scale = (r.zoom * 0.8 * Math.min(W, H)) / extent;
  const [cy, sy, cp, sp] = [Math.cos(r.yaw), Math.sin(r.yaw), Math.cos(r.pitch), Math.sin(r.pitch)];
  const project = (v) => {
    const [a, b, c] = [v[0] - centre[0], v[1] - centre[1], v[2] - centre[2]];
    const right = a * cy - b * sy;
    const depth = a * sy + b * cy;
    return [W / 2 + scale * right, H / 2 - scale * (c * cp + depth * sp)];
  };
  // the world's origin and axes, 0.5 m each: x red, y green, z blue
  const o = project(worldAxes(0, 0, 0));
  [[[0.5, 0, 0], "#e53935"], [[0, 0.5, 0], "#43a047"], [[0, 0, 0.5], "#1e88e5"]].forEach(([d, colour]) => {
    const e = project(worldAxes(...d));
    g.strokeStyle = colour;
    g.lineWidth = 1;
    g.beginPath();
    g.moveTo(...o);
    g.lineTo(...e);
    g.stroke();
  });
  let skeletons = 0;
  let drawnPoints = 0;
  if (pm) {
    const colour = Object.fromEntries(pm.groups.map((grp) => [grp.name, grp.color]));
    for (const person of people) {
      const screen = person.points.map((v) => v && project(v));
      g.lineWidth = 2;
      for (const [a, b, group] of pm.skeleton) {
        if (!screen[a] || !screen[b]) continue;
        g.strokeStyle = colour[group];
        g.beginPath();
        g.moveTo(...screen[a]);
        g.lineTo(...screen[b]);
        g.stroke();
      }
      let top = null;
      screen.forEach((s, k) => {
        if (!s) return;
        drawnPoints += 1;
        const group = pm.group_of[k];
        g.fillStyle = colour[group];
        g.beginPath();
        g.arc(s[0], s[1], group === "face" ? 1 : 2.5, 0, 2 * Math.PI);
        g.fill();
        if (!top || s[1] < top[1]) top = s;
      });
      if (top) {
        tag(g, `#${person.id}`, top[0], top[1] - 6, PERSON_COLOUR);
        skeletons += 1;
      }
    }
  }
  const bodies = pm ? drawBodies(g, r, now, pm, project) : 0;
  r.counts.bodies += bodies;
  r.counts.skeletons += skeletons;
  r.counts.points += drawnPoints;
  r.counts.renders += 1;
  r.canvas.dataset.skeletons = String(skeletons);
  const h = msg?.header;
  r.statsBox.textContent = h
    ? `group ${h.seq}: ${h.count} people, ${drawnPoints} points; skew ${h.skew_ms.toFixed(1)} ms; ` +
      `views ${Object.keys(h.views).join(", ")}${h.missing.length ? `; missing ${h.missing.join(", ")}` : ""}`
    : "waiting for pose3d";
}

// A rig's fitted bodies (body/<rig>): their keypoints, named in the header by meta.pose's
// names, joined by the skeleton's edges between them, in white over the triangulated points.
function drawBodies(g, r, now, pm, project) {
  const msg = r.body && now - r.bodyAt <= POSE3D_KEEP_MS ? r.body : null;
  if (!msg) return 0;
  const index = msg.header.keypoints.map((name) => pm.names.indexOf(name));
  const [P, N] = msg.arrays.keypoints.shape;
  const kp = msg.arrays.keypoints.data;
  g.strokeStyle = BODY_COLOUR;
  g.fillStyle = BODY_COLOUR;
  g.lineWidth = 1;
  for (let p = 0; p < P; p++) {
    const at = new Map();
    for (let n = 0; n < N; n++) {
      const o = 3 * (p * N + n);
      if (index[n] >= 0 && Number.isFinite(kp[o])) at.set(index[n], project(worldAxes(kp[o], kp[o + 1], kp[o + 2])));
    }
    for (const [a, b] of pm.skeleton) {
      if (!at.has(a) || !at.has(b)) continue;
      g.beginPath();
      g.moveTo(...at.get(a));
      g.lineTo(...at.get(b));
      g.stroke();
    }
    for (const s of at.values()) g.fillRect(s[0] - 1, s[1] - 1, 3, 3);
  }
  return P;
}

function camera(name) {
  let cam = state.cameras.get(name);
  if (!cam) {
    cam = new Camera(name);
    state.cameras.set(name, cam);
  }
  return cam;
}

function handle(msg) {
  const h = msg.header;
  if (h.synthetic && !state.synthetic.has(h.model)) {
    // names the synthetic models: the per-frame pose beside them has real weights
    state.synthetic.add(h.model);
    const banner = document.getElementById("synthetic");
    banner.textContent = `SYNTHETIC weights (${[...state.synthetic].sort().join(", ")}): their results are meaningless`;
    banner.hidden = false;
  }
  const now = performance.now();
  switch (h.kind) {
    case "meta":
      state.meta = h.meta;
      legend();
      for (const name of h.meta.cameras ?? []) camera(name);
      break;
    case "stats":
      state.stats = h.stats;
      for (const name of Object.keys(h.stats.cameras ?? {})) camera(name);
      break;
    case "det":
      camera(h.camera).det(msg);
      break;
    case "pose3d":
      rig(h.camera).update(msg, now);
      break;
    case "body": {
      const r = rig(h.camera);
      r.body = msg;
      r.bodyAt = now;
      break;
    }
    case "pose":
      if (h.live) {
        const a = msg.arrays;
        camera(h.camera).livePoses.set(h.track_id, {
          keypoints: a.keypoints.data, count: h.count, source: a.source.data, age: a.keyframe_age_ms.data, at: now,
        });
      } else {
        camera(h.camera).poses.set(h.track_id, { keypoints: msg.arrays.keypoints.data, count: h.count, at: now });
      }
      break;
    case "face":
      if (h.track_id === null) {
        const faces = camera(h.camera).untrackedFaces;
        faces.push({ msg, at: now });
        if (faces.length > 16) faces.shift();
      } else {
        camera(h.camera).faces.set(h.track_id, { identity: h.identity, similarity: h.similarity, reason: h.reason, at: now });
      }
      break;
    case "clip":
      camera(h.camera).clips.set(h.track_id ?? "frame", { label: h.top_label, probability: h.top_probability, at: now });
      break;
    case "preview":
      preview(camera(h.camera), msg, now);
      return;
    default:
      return; // a kind this page does not know: ignored, as the protocol asks
  }
  scheduleRender();
}

function preview(cam, msg, now) {
  const seq = msg.header.seq;
  const blob = new Blob([msg.arrays.jpeg.data], { type: "image/jpeg" });
  createImageBitmap(blob).then((bitmap) => {
    if (cam.frame && cam.frame.seq > seq) return bitmap.close(); // an older one decoded late
    cam.frame?.bitmap.close();
    cam.frame = { bitmap, seq, width: msg.header.width, height: msg.header.height, at: now };
    cam.frameDirty = true;
    scheduleRender();
  }, () => {});
}

let renderPending = false;
function scheduleRender() {
  if (renderPending) return;
  renderPending = true;
  requestAnimationFrame(() => {
    renderPending = false;
    const now = performance.now();
    for (const cam of state.cameras.values()) render(cam, now);
    for (const r of state.rigs.values()) renderRig(r, now);
    header();
  });
}

function fit(cam, det) {
  const size = cam.frame ?? (det && { width: det.header.width, height: det.header.height });
  if (!size || !size.width) return false;
  const w = WIDTH;
  const h = Math.round((WIDTH * size.height) / size.width);
  for (const c of [cam.frameCanvas, cam.overlay]) {
    if (c.width !== w || c.height !== h) {
      c.width = w;
      c.height = h;
      cam.frameDirty = true;
    }
  }
  return true;
}

function render(cam, now) {
  const det = cam.detToDraw(now);
  if (!fit(cam, det)) return;
  const W = cam.overlay.width;
  const H = cam.overlay.height;
  if (cam.frameDirty) {
    const f = cam.frameCanvas.getContext("2d");
    f.fillStyle = "#000";
    f.fillRect(0, 0, W, H);
    if (cam.frame) {
      f.drawImage(cam.frame.bitmap, 0, 0, W, H);
      cam.counts.frames += 1;
    }
    cam.frameDirty = false;
  }
  const g = cam.overlay.getContext("2d");
  g.clearRect(0, 0, W, H);
  let boxes = 0;
  let skeletons = 0;
  let liveSkeletons = 0;
  if (det) {
    const s = W / det.header.width;
    const tracks = new Set();
    const b = det.arrays.boxes.data;
    const ids = det.header.track_ids ?? [];
    det.header.labels.forEach((label, i) => {
      const track = ids[i] ?? null;
      const isPerson = label === "person";
      if (isPerson && track !== null) tracks.add(track);
      const colour = isPerson ? PERSON_COLOUR : FACE_COLOUR;
      const [x1, y1, x2, y2] = [b[4 * i] * s, b[4 * i + 1] * s, b[4 * i + 2] * s, b[4 * i + 3] * s];
      g.lineWidth = 2;
      g.strokeStyle = colour;
      g.strokeRect(x1, y1, x2 - x1, y2 - y1);
      boxes += 1;
      const text = isPerson ? personText(cam, track, now) : faceText(cam, track, now);
      if (text) tag(g, text, x1, isPerson ? y1 : y2 + 16, colour);
    });
    // a pose is drawn while its track is in the frame's det; with no tracked box at all
    // (a config without a person detector in this process), every recent pose. A track's
    // per-frame pose, while it comes, is drawn instead of its (older) Sapiens2 keyframe.
    for (const [track, pose] of cam.livePoses) {
      if (now - pose.at > LIVE_KEEP_MS) cam.livePoses.delete(track);
      else if ((tracks.has(track) || tracks.size === 0) && skeleton(g, pose, s)) liveSkeletons += 1;
    }
    for (const [track, pose] of cam.poses) {
      if (now - pose.at > POSE_KEEP_MS) cam.poses.delete(track);
      else if (cam.livePoses.has(track)) continue;
      else if ((tracks.has(track) || tracks.size === 0) && skeleton(g, pose, s)) skeletons += 1;
    }
    for (const { msg, at } of cam.untrackedFaces) {
      if (now - at > LABEL_KEEP_MS) continue;
      const [x1, y1, x2, y2] = Array.from(msg.arrays.box.data, (v) => v * s);
      g.strokeStyle = FACE_COLOUR;
      g.strokeRect(x1, y1, x2 - x1, y2 - y1);
      boxes += 1;
      tag(g, identityText(msg.header), x1, y2 + 16, FACE_COLOUR);
    }
  }
  cam.counts.boxes += boxes;
  cam.counts.skeletons += skeletons + liveSkeletons;
  cam.counts.liveSkeletons += liveSkeletons;
  cam.counts.renders += 1;
  cam.lastDrawn = { boxes, skeletons: skeletons + liveSkeletons, liveSkeletons };
  cam.overlay.dataset.boxes = String(boxes);
  cam.overlay.dataset.skeletons = String(skeletons + liveSkeletons);
  cam.overlay.dataset.liveSkeletons = String(liveSkeletons);
  cam.statsBox.textContent = statsText(cam, det);
}

function personText(cam, track, now) {
  if (track === null) return "";
  const clip = cam.clips.get(track);
  const label = clip && now - clip.at < LABEL_KEEP_MS ? `  ${clip.label} ${clip.probability.toFixed(2)}` : "";
  return `#${track}${keyframeText(cam.livePoses.get(track))}${label}`;
}

// A live pose's keyframe: the youngest age behind any of its points, or "no keyframe yet".
function keyframeText(pose) {
  if (!pose) return "";
  let age = Infinity;
  for (let k = 0; k < pose.count; k++) if (pose.source[k] !== SOURCE_ABSENT && pose.age[k] < age) age = pose.age[k];
  return Number.isFinite(age) ? `  keyframe ${(age / 1000).toFixed(1)} s` : "  no keyframe";
}

function faceText(cam, track, now) {
  const face = track === null ? null : cam.faces.get(track);
  if (!face || now - face.at > LABEL_KEEP_MS) return track === null ? "" : `#${track}`;
  return `#${track} ${identityText(face)}`;
}

function identityText(f) {
  return f.identity !== null ? `${f.identity} ${f.similarity.toFixed(2)}` : `unknown (${f.reason}) ${f.similarity.toFixed(2)}`;
}

function tag(g, text, x, y, colour) {
  g.font = "12px sans-serif";
  y = Math.min(Math.max(y, 15), g.canvas.height - 1); // inside the canvas
  x = Math.max(0, x);
  const w = g.measureText(text).width + 6;
  g.fillStyle = "rgba(0, 0, 0, 0.65)";
  g.fillRect(x, y - 14, w, 15);
  g.fillStyle = colour;
  g.fillText(text, x + 3, y - 3);
}

// One pose: the edges, then the points, each in its keypoint group's colour from meta.
function skeleton(g, pose, s) {
  const pm = state.meta?.pose;
  if (!pm || pose.count !== pm.count) return false;
  const kp = pose.keypoints;
  const colour = Object.fromEntries(pm.groups.map((grp) => [grp.name, grp.color]));
  const ok = (k) => kp[3 * k + 2] > MIN_SCORE;
  g.lineWidth = 2;
  for (const [a, b, group] of pm.skeleton) {
    if (!ok(a) || !ok(b)) continue;
    g.strokeStyle = colour[group];
    g.beginPath();
    g.moveTo(kp[3 * a] * s, kp[3 * a + 1] * s);
    g.lineTo(kp[3 * b] * s, kp[3 * b + 1] * s);
    g.stroke();
  }
  for (let k = 0; k < pm.count; k++) {
    if (!ok(k)) continue;
    const group = pm.group_of[k];
    g.fillStyle = colour[group];
    g.beginPath();
    g.arc(kp[3 * k] * s, kp[3 * k + 1] * s, group === "face" ? 1.5 : 3, 0, 2 * Math.PI);
    g.fill();
  }
  return true;
}

function deviceBusy() {
  const out = [];
  for (const [stage, st] of Object.entries(state.stats?.stages ?? {})) {
    const busy = st.gauges?.device_busy_fraction;
    if (busy !== undefined) out.push(`${(100 * busy).toFixed(1)}% (${stage})`);
  }
  return out.join(", ");
}

function statsText(cam, det) {
  const c = state.stats?.cameras?.[cam.name];
  const lines = [];
  const lag = det ? `${lagMs(det.header).toFixed(1)} ms` : "-";
  lines.push(`fps ${c ? c.fps.toFixed(1) : "-"}  lag ${lag}  ${c ? c.health : ""}`);
  const drops = {};
  for (const st of Object.values(state.stats?.stages ?? {})) {
    for (const [reason, n] of Object.entries(st.drops?.[cam.name] ?? {})) drops[reason] = (drops[reason] ?? 0) + n;
  }
  const dropText = Object.entries(drops).map(([r, n]) => `${r} ${n}`).join("  ");
  lines.push(`drops ${dropText || "0"}`);
  lines.push(`device busy ${deviceBusy() || "-"}`);
  const frameClip = cam.clips.get("frame");
  if (frameClip) lines.push(`frame: ${frameClip.label} ${frameClip.probability.toFixed(2)}`);
  return lines.join("\n");
}

function header() {
  const v = state.view;
  const status = document.getElementById("status");
  if (v) {
    const age = v.last_message_age_s === null ? "no message yet" : `last message ${v.last_message_age_s} s ago`;
    status.textContent = `${v.endpoint}: ${v.received} messages, ${v.malformed} malformed, ${v.dropped} dropped by this page; ${age}`;
  }
  const busy = deviceBusy();
  document.getElementById("device").textContent = busy ? `device busy ${busy}` : "";
}

function legend() {
  const items = [["person box", PERSON_COLOUR], ["face box", FACE_COLOUR]];
  for (const grp of state.meta.pose.groups) items.push([`${grp.name} keypoints`, grp.color]);
  if (state.meta.rigs?.length) items.push(["fitted body (3D)", BODY_COLOUR]);
  const footer = document.getElementById("legend");
  footer.replaceChildren(...items.map(([name, colour]) => {
    const span = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = colour;
    span.append(swatch, name);
    return span;
  }));
}

let decodeErrors = 0;
function connect() {
  const ws = new WebSocket(`ws://${location.host}/ws`);
  ws.binaryType = "arraybuffer";
  ws.onmessage = (event) => {
    if (typeof event.data === "string") {
      state.view = JSON.parse(event.data).view;
      header();
      return;
    }
    let msg;
    try {
      msg = decode(event.data);
    } catch (err) {
      decodeErrors += 1;
      if (decodeErrors <= 5) console.warn("npucam view: skipped a message:", err.message);
      return;
    }
    handle(msg);
  };
  ws.onclose = () => {
    document.getElementById("status").textContent = "disconnected from the view server; retrying...";
    setTimeout(connect, 1000);
  };
}

// Pixels of one colour (#rrggbb, opaque) on a canvas.
function canvasPixels(canvas, hex) {
  if (!canvas.width) return 0;
  const [r, g, b] = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
  const px = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let n = 0;
  for (let i = 0; i < px.length; i += 4) if (px[i] === r && px[i + 1] === g && px[i + 2] === b && px[i + 3] === 255) n += 1;
  return n;
}

// For tests and the console: per camera and rig what was drawn, and pixels of one colour.
window.npucamView = {
  state,
  counts() {
    return Object.fromEntries([...state.cameras].map(([name, cam]) => [name, { ...cam.counts, last: cam.lastDrawn }]));
  },
  rigCounts() {
    return Object.fromEntries([...state.rigs].map(([name, r]) => [name, { ...r.counts, yaw: r.yaw, pitch: r.pitch }]));
  },
  overlayPixels(name, hex) {
    const cam = state.cameras.get(name);
    return cam ? canvasPixels(cam.overlay, hex) : 0;
  },
  rigPixels(name, hex) {
    const r = state.rigs.get(name);
    return r ? canvasPixels(r.canvas, hex) : 0;
  },
};

connect();
