"""pipeline.security: key generation, key-file checks with messages naming the key path and
file, config validation of [security] and per-socket tables, loopback defaults and the
plain-bind warning; and the at-rest side: gallery files 0600 and atomic, bundle paths
confined."""

from __future__ import annotations

import logging
import os
import stat
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import zmq
import zmq.auth
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu.bundle import confine
from pipeline import security
from pipeline.cli import main
from pipeline.config import load_config
from pipeline.graph import stage_class, stage_kinds
from pipeline.metrics import Metrics, start_prometheus
from pipeline.security import SecurityError, SocketSecurity

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def keys(tmp_path):
    """A server pair, a client pair and an allow-list directory holding the client's key."""
    d = tmp_path / "keys"
    server = security.generate_keys("server", d)
    client = security.generate_keys("client", d)
    allowed = d / "allowed"
    allowed.mkdir()
    (allowed / "client.key").write_bytes(client[0].read_bytes())
    return {"dir": d, "server": server, "client": client, "allowed": allowed}


# ---- npucam keys generate -------------------------------------------------------------------


def test_keys_generate_writes_a_loadable_pair_with_a_private_secret(tmp_path, capsys):
    old = os.umask(0)  # even a permissive umask must not leave the secret readable
    try:
        assert main(["keys", "generate", "cam-01", "--dir", str(tmp_path / "k")]) == 0
    finally:
        os.umask(old)
    public, secret = tmp_path / "k" / "cam-01.key", tmp_path / "k" / "cam-01.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    pub, sec = zmq.auth.load_certificate(secret)
    assert zmq.auth.load_certificate(public) == (pub, None)
    assert zmq.curve_public(sec) == pub and len(pub) == 40
    assert security.read_key_pair(secret, "x") == (pub, sec)
    assert sorted(p.name for p in (tmp_path / "k").iterdir()) == ["cam-01.key", "cam-01.key_secret"]
    assert str(secret) in capsys.readouterr().out


def test_keys_generate_keeps_existing_keys_unless_forced(tmp_path, capsys):
    assert main(["keys", "generate", "a", "--dir", str(tmp_path)]) == 0
    first = (tmp_path / "a.key_secret").read_bytes()
    assert main(["keys", "generate", "a", "--dir", str(tmp_path)]) == 2
    assert "exists; not overwriting" in capsys.readouterr().err
    assert (tmp_path / "a.key_secret").read_bytes() == first
    assert main(["keys", "generate", "a", "--dir", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "a.key_secret").read_bytes() != first
    assert main(["keys", "generate", "../evil", "--dir", str(tmp_path)]) == 2
    assert "use letters, digits" in capsys.readouterr().err


# ---- key files ------------------------------------------------------------------------------


def test_key_file_problems_name_the_key_path_and_the_file(tmp_path, keys):
    where = "security.server_secret_key"

    def error(path) -> str:
        with pytest.raises(SecurityError) as exc:
            security.read_key_pair(path, where)
        text = str(exc.value)
        assert text.startswith(f"{where}: {path}: "), text
        return text

    assert "no such key file" in error(tmp_path / "missing.key_secret")
    assert "is a directory" in error(keys["allowed"])
    junk = tmp_path / "junk.key_secret"
    junk.write_bytes(b"\x00\xff not a certificate\n")
    junk.chmod(0o600)
    assert "not a ZeroMQ certificate" in error(junk)
    assert "give the .key_secret file" in error(keys["server"][0])  # the public half
    loose = tmp_path / "loose.key_secret"
    loose.write_bytes(keys["server"][1].read_bytes())
    loose.chmod(0o644)
    assert "mode 0644" in error(loose) and f"chmod 600 {loose}" in error(loose)
    short = tmp_path / "short.key_secret"
    short.write_text('curve\n    public-key = "abc"\n    secret-key = "def"\n')
    short.chmod(0o600)
    assert "public-key is not a 40-character Z85 key" in error(short)
    mixed = tmp_path / "mixed.key_secret"
    other_public = zmq.auth.load_certificate(keys["client"][0])[0].decode()
    server_secret = zmq.auth.load_certificate(keys["server"][1])[1].decode()
    mixed.write_text(
        f'curve\n    public-key = "{other_public}"\n    secret-key = "{server_secret}"\n'
    )
    mixed.chmod(0o600)
    assert "public-key does not match secret-key" in error(mixed)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_key_file_is_named(tmp_path, keys):
    locked = tmp_path / "locked.key"
    locked.write_bytes(keys["client"][0].read_bytes())
    locked.chmod(0)
    with pytest.raises(SecurityError, match=f"x: {locked}: cannot read the key file"):
        security.read_public_key(locked, "x")


def test_allow_list_is_a_directory_of_key_files_or_one_file(tmp_path, keys):
    client_public = zmq.auth.load_certificate(keys["client"][0])[0]
    assert security.read_allow_list(keys["allowed"], "a") == {client_public}
    assert security.read_allow_list(keys["client"][0], "a") == {client_public}
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SecurityError, match=f"a: {empty}: holds no \\*.key public key files"):
        security.read_allow_list(empty, "a")
    (keys["allowed"] / "bad.key").write_text("nonsense\n")
    with pytest.raises(SecurityError, match="bad.key: not a ZeroMQ certificate"):
        security.read_allow_list(keys["allowed"], "a")


# ---- config ---------------------------------------------------------------------------------


def _publish_config(write_config, security_table: str, stage_extra: str = "") -> Path:
    return write_config(
        f"""
        {security_table}
        [[cameras]]
        name = "card"
        url = "synthetic:"
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "publish"
        {stage_extra}
        """
    )


def test_validate_accepts_a_good_security_section(write_config, keys, capsys):
    path = _publish_config(
        write_config,
        f"""
        [security]
        server_secret_key = "{keys["server"][1]}"
        authorized_clients = "keys/allowed"
        """,
    )
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err


def test_validate_names_the_key_path_and_file_at_fault(write_config, keys, tmp_path, capsys):
    loose = tmp_path / "loose.key_secret"
    loose.write_bytes(keys["server"][1].read_bytes())
    loose.chmod(0o640)
    path = _publish_config(
        write_config,
        """
        [security]
        server_secret_key = "loose.key_secret"
        authorized_clients = "keys/nowhere"
        client_secret_key = "keys/server.key"
        """,
    )
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: security.server_secret_key: {loose}: secret key file has mode 0640" in err
    assert f"{path}: security.authorized_clients: {tmp_path}/keys/nowhere: no such" in err
    # Named in [security] but used by no socket here: still checked.
    assert f"security.client_secret_key: {tmp_path}/keys/server.key: holds no secret-key" in err
    assert err.count("secret key file has mode 0640") == 1  # each problem once


def test_a_socket_missing_a_key_its_role_needs_is_named(write_config, keys, capsys):
    path = _publish_config(write_config, f'[security]\nserver_secret_key = "{keys["server"][1]}"')
    assert main(["validate", str(path)]) == 2
    assert (
        "security.authorized_clients: publish publish binds with CURVE and needs "
        "`authorized_clients` in [security]"
    ) in capsys.readouterr().err


def test_per_socket_tables_override_and_are_named_by_their_key_path(write_config, keys, capsys):
    path = _publish_config(
        write_config,
        f"""
        [security]
        server_secret_key = "{keys["server"][1]}"
        authorized_clients = "keys/allowed"
        """,
        'security = { server_secret_key = "keys/other.key_secret" }',
    )
    assert main(["validate", str(path)]) == 2
    assert "stages[1].security.server_secret_key: " in capsys.readouterr().err

    camera = write_config(
        f"""
        [[cameras]]
        name = "remote"
        url = "zmq:tcp://127.0.0.1:5999"
        security = {{ server_public_key = "{keys["server"][0]}" }}
        [[cameras]]
        name = "file"
        url = "synthetic:"
        security = {{ server_public_key = "{keys["server"][0]}" }}
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "publish"
        """,
        name="camera.toml",
    )
    assert main(["validate", str(camera)]) == 2
    err = capsys.readouterr().err
    assert "cameras[0].security.client_secret_key: camera remote connects with CURVE" in err
    assert "cameras[1].security: only zmq: cameras open a socket" in err
    # The publish socket has no [security] and no table of its own: plain, so not mentioned.
    assert "publish" not in err


def test_curve_for_is_none_without_security_and_loads_keys_with_it(write_config, keys):
    plain = load_config(_publish_config(write_config, ""))
    assert security.curve_for(plain, bind=True, socket="s") is None
    config = load_config(
        _publish_config(
            write_config,
            f"""
            [security]
            server_secret_key = "{keys["server"][1]}"
            server_public_key = "{keys["server"][0]}"
            client_secret_key = "{keys["client"][1]}"
            authorized_clients = "keys/allowed"
            """,
        )
    )
    server_pub, server_sec = zmq.auth.load_certificate(keys["server"][1])
    client_pub, client_sec = zmq.auth.load_certificate(keys["client"][1])
    assert security.curve_for(config, bind=True, socket="s") == security.Curve(
        server_pub, server_sec, authorized=frozenset([client_pub])
    )
    assert security.curve_for(config, bind=False, socket="s") == security.Curve(
        server_pub, None, client_pub, client_sec
    )


# ---- loopback -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "loopback"),
    [
        ("tcp://127.0.0.1:5560", True),
        ("tcp://127.0.0.1:*", True),
        ("tcp://127.3.4.5:1", True),
        ("tcp://[::1]:5560", True),
        ("tcp://localhost:5560", True),
        ("tcp://lo:5560", True),
        ("tcp://10.0.0.2;127.0.0.1:5560", True),
        ("ipc:///tmp/npucam.sock", True),
        ("inproc://x", True),
        ("tcp://*:5560", False),
        ("tcp://0.0.0.0:5560", False),
        ("tcp://[::]:5560", False),
        ("tcp://eth0:5560", False),
        ("tcp://192.168.1.20:5560", False),
        ("tcp://camera-host:5560", False),
        ("ws://127.0.0.1:5560", False),
        ("epgm://eth0;239.192.1.1:5555", False),
    ],
)
def test_is_loopback(endpoint, loopback):
    assert security.is_loopback(endpoint) is loopback


def test_every_default_endpoint_is_loopback():
    checked = 0
    for kind in stage_kinds():
        for name, field in stage_class(kind).Options.model_fields.items():
            if isinstance(field.default, str) and "://" in field.default:
                assert security.is_loopback(field.default), (kind, name, field.default)
                checked += 1
    assert checked >= 1  # publish's bind
    push = stage_class("zmq_push").Options.model_fields
    assert push["bind"].default is None and push["connect"].default is None  # no default


def test_prometheus_without_a_host_binds_loopback():
    server = start_prometheus(Metrics(), ":0")
    try:
        assert server.server_address[0] == "127.0.0.1"
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        assert urllib.request.urlopen(url, timeout=5).status == 200
    finally:
        server.shutdown()
        server.server_close()


def test_shipped_configs_bind_only_loopback():
    import tomllib

    binds = []
    for path in sorted((REPO / "configs").glob("*.toml")):
        data = tomllib.loads(path.read_text())
        binds += [(path.name, s["bind"]) for s in data.get("stages", []) if "bind" in s]
        prom = data.get("metrics", {}).get("prometheus")
        if prom:
            binds.append((path.name, f"tcp://{prom}"))
    assert binds
    assert [b for b in binds if not security.is_loopback(b[1])] == []


class _RecordingSocket:
    """Stands in for a zmq socket so the warning is checked without a real wide bind."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def bind(self, endpoint: str) -> None:
        self.calls.append(("bind", endpoint))

    def connect(self, endpoint: str) -> None:
        self.calls.append(("connect", endpoint))


def test_plain_sockets_beyond_loopback_log_a_warning(caplog):
    guard = SocketSecurity(None, None, "publish out")
    sock = _RecordingSocket()
    with caplog.at_level(logging.WARNING, logger="pipeline.security"):
        guard.bind(sock, "tcp://127.0.0.1:5560")
        guard.connect(sock, "tcp://[::1]:5560")
        assert caplog.records == []
        guard.bind(sock, "tcp://0.0.0.0:5560")
        guard.connect(sock, "tcp://10.1.2.3:5571")
    assert sock.calls == [
        ("bind", "tcp://127.0.0.1:5560"),
        ("connect", "tcp://[::1]:5560"),
        ("bind", "tcp://0.0.0.0:5560"),
        ("connect", "tcp://10.1.2.3:5571"),
    ]
    text = [r.getMessage() for r in caplog.records]
    assert len(text) == 2
    assert text[0].startswith("publish out: binds tcp://0.0.0.0:5560 without CURVE")
    assert text[1].startswith("publish out: connects to tcp://10.1.2.3:5571 without CURVE")


# ---- at rest: gallery files and bundle paths ------------------------------------------------


def _gallery():
    from stages.gallery import Gallery

    rng = np.random.default_rng(0)
    e = rng.standard_normal((2, 512)).astype(np.float32)
    return Gallery.empty(512).add("ada", e / np.linalg.norm(e, axis=1, keepdims=True))


def test_gallery_writes_are_private_atomic_and_never_follow_a_symlink(tmp_path):
    from stages.gallery import read_gallery, write_gallery

    g = _gallery()
    path = tmp_path / "g" / "gallery.npz"
    old = os.umask(0)
    try:
        write_gallery(path, g)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)  # an existing readable gallery is replaced by a private one
    write_gallery(path, g)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(path.parent) == ["gallery.npz"]  # no temp file left behind

    # A symlink planted at the gallery path: the write replaces the link, not its target.
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    link = tmp_path / "g" / "linked.npz"
    link.symlink_to(victim)
    write_gallery(link, g)
    assert victim.read_text() == "keep me"
    assert not link.is_symlink() and stat.S_IMODE(link.stat().st_mode) == 0o600
    assert read_gallery(link).names == g.names


def test_a_failed_gallery_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    from stages import gallery

    path = tmp_path / "gallery.npz"
    gallery.write_gallery(path, gallery.Gallery.empty(512))
    before = path.read_bytes()

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gallery.os, "replace", refuse)
    with pytest.raises(gallery.GalleryError, match=f"{path}: cannot write the gallery"):
        gallery.write_gallery(path, _gallery())
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["gallery.npz"]


def test_bundle_paths_cannot_leave_the_bundle(tmp_path):
    root = tmp_path / "bundle"
    (root / "w").mkdir(parents=True)
    (tmp_path / "secret").write_text("x")
    (root / "w" / "escape").symlink_to(tmp_path / "secret")
    assert confine(root, "w/ok.bin") == root / "w" / "ok.bin"
    # the manifest text is confined; a file the bundle's owner linked elsewhere is followed
    # (a Hugging Face cache snapshot links every file into ../../blobs: docs/bundles.md)
    assert confine(root, "w/escape").read_text() == "x"
    for rel, reason in [
        ("/etc/passwd", "absolute"),
        ("../secret", "climbs out"),
        ("w/../../secret", "climbs out"),
        ("a\x00b", "NUL"),
    ]:
        with pytest.raises(ValueError, match=reason):
            confine(root, rel)


def test_security_docs_quote_the_shipped_secure_configs():
    import re
    import tomllib

    doc = (REPO / "docs" / "security.md").read_text()
    blocks = [b for b in re.findall(r"```toml\n(.*?)```", doc, re.S) if "[security]" in b]
    shipped = [
        tomllib.loads((REPO / "configs" / name).read_text())["security"]
        for name in ("split-capture-secure.toml", "split-infer-secure.toml")
    ]
    assert [tomllib.loads(b)["security"] for b in blocks] == shipped


def test_prometheus_beyond_loopback_logs_a_warning(write_config, monkeypatch, caplog):
    import asyncio

    from pipeline import graph

    class FakeServer:  # no real wide bind in a test
        def __init__(self, host: str) -> None:
            self.server_address = (host, 9108)

        def shutdown(self) -> None:
            pass

        def server_close(self) -> None:
            pass

    def run(host: str) -> list[str]:
        monkeypatch.setattr(graph, "start_prometheus", lambda metrics, address: FakeServer(host))
        path = write_config(
            """
            [metrics]
            prometheus = "somewhere:9108"
            stats_interval_s = 0
            [[cameras]]
            name = "card"
            url = "synthetic:"
            [[stages]]
            kind = "capture"
            [[stages]]
            kind = "publish"
            bind = "tcp://127.0.0.1:*"
            """
        )
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="pipeline.graph"):
            pipeline = graph.Pipeline(load_config(path))
            assert asyncio.run(pipeline.run(duration=0.2, handle_signals=False)) == 0
        return [r.getMessage() for r in caplog.records if "prometheus" in r.getMessage()]

    assert run("127.0.0.1") == []
    assert run("0.0.0.0") == [
        "prometheus metrics on 0.0.0.0 are plain HTTP without authentication, reachable "
        "from the network (docs/security.md)"
    ]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=300), prefix=st.sampled_from([b"", b"curve\n    public-key = "]))
def test_key_readers_raise_only_security_errors(tmp_path, data, prefix):
    path = tmp_path / "fuzz.key_secret"
    path.write_bytes(prefix + data)
    path.chmod(0o600)
    for reader in (security.read_key_pair, security.read_public_key, security.read_allow_list):
        try:
            reader(path, "k")
        except SecurityError as exc:
            assert str(exc).startswith(f"k: {path}: ")


def test_a_config_named_gallery_resolves_against_the_config_and_is_only_read(write_config):
    from pipeline.graph import Context
    from stages import gallery
    from stages.models.adaface.post import FaceMatch

    path = write_config("[[stages]]\nkind = 'publish'\n")
    config = load_config(path)
    file = config.base_dir / "faces" / "gallery.npz"
    gallery.write_gallery(file, _gallery())
    before = (file.read_bytes(), file.stat().st_mtime_ns)
    options = FaceMatch.Options.model_validate({"gallery": "faces/gallery.npz"})
    stage = FaceMatch("face_match", options, Context(config, Metrics()))
    assert stage.gallery.path == file
    assert stage.gallery.current.names == ("ada", "ada")
    assert (file.read_bytes(), file.stat().st_mtime_ns) == before
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
