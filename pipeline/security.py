"""CURVE encryption and authentication for every ZeroMQ socket npucam opens (docs/security.md).

A config's `[security]` table (or one socket's own `security` table, field by field over it)
names key files in pyzmq's certificate format (zmq.auth.create_certificates: `NAME.key`
holds a public key, `NAME.key_secret` the pair). With it, every socket runs CURVE
(libzmq's CurveZMQ: Curve25519 key exchange, then every message encrypted and authenticated):

- a binding socket is a CURVE server: `server_secret_key` is its identity, and a ZAP
  authenticator (zmq.auth.ThreadAuthenticator, one per zmq.Context) admits only the client
  public keys of `authorized_clients` (a directory of `*.key` files, or one such file);
- a connecting socket is a CURVE client: `client_secret_key` is its identity, and it only
  completes the handshake with the server whose public key is `server_public_key`.

Without security configured, sockets stay plain (ZeroMQ's NULL mechanism) and a bind or
connect that reaches beyond loopback logs a warning. Stages open sockets through
SocketSecurity so the rule holds for every stage:

    class Options(StageOptions):
        security: SecuritySection | None = None     # the socket's own overrides

    @classmethod
    def check(cls, config, index):                  # `npucam validate` checks the keys
        return security.check_stage(cls, config, index, bind=True)

    async def run(self, inbox, out):
        ctx = zmq.asyncio.Context()
        guard = SocketSecurity(ctx, security.stage_curve(self, bind=True), f"{self.kind} ...")
        guard.bind(sock, endpoint)                  # or guard.connect(sock, endpoint)
        ...
        guard.close()                               # before ctx.term()

(curve_for / check_curve do the same for sockets that are not a stage's, e.g. cameras.)

Key problems (missing, unreadable, not a certificate, a secret key other users can read, a
public key that does not match its secret) are SecurityErrors whose lines name the config
key path and the file.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import itertools
import logging
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from pipeline.config import NAME_PATTERN, Config, SecuritySection
from pipeline.errors import NpucamError

log = logging.getLogger(__name__)

KEY_FIELDS = ("server_secret_key", "server_public_key", "client_secret_key", "authorized_clients")
# What each side of a connection needs.
BIND_NEEDS = ("server_secret_key", "authorized_clients")
CONNECT_NEEDS = ("server_public_key", "client_secret_key")
Z85_KEY_LENGTH = 40  # 32-byte Curve25519 keys in Z85 text


class SecurityError(NpucamError):
    """Key files or security settings that cannot be used; one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Curve:
    """The loaded CURVE keys of one socket, as Z85 bytes.

    Binding: server_public/server_secret are this socket's pair, authorized the client keys
    it admits. Connecting: server_public is the server's key, client_* this socket's pair.
    """

    server_public: bytes | None = None
    server_secret: bytes | None = None
    client_public: bytes | None = None
    client_secret: bytes | None = None
    authorized: frozenset[bytes] | None = None


# ---- key files ------------------------------------------------------------------------------


def _problem(where: str, path: Path, what: str) -> SecurityError:
    return SecurityError([f"{where}: {path}: {what}"])


def _certificate(path: Path, where: str) -> tuple[bytes, bytes | None]:
    """zmq.auth.load_certificate, with every failure as a SecurityError naming where/path."""
    if not path.exists():
        raise _problem(
            where, path, "no such key file (`npucam keys generate NAME --dir DIR` makes a pair)"
        )
    if path.is_dir():
        raise _problem(where, path, "is a directory, expected a key file")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except PermissionError:
        raise _problem(where, path, "cannot read the key file: permission denied") from None
    except OSError as exc:
        raise _problem(where, path, f"cannot read the key file: {exc.strerror or exc}") from None
    except ValueError:
        raise _problem(
            where,
            path,
            "not a ZeroMQ certificate (no public-key line); make one with "
            "`npucam keys generate NAME`",
        ) from None
    _check_z85(public, where, path, "public-key")
    if secret is not None:
        _check_z85(secret, where, path, "secret-key")
    return public, secret


def _check_z85(key: bytes, where: str, path: Path, field: str) -> None:
    try:
        ok = len(key) == Z85_KEY_LENGTH and len(z85.decode(key)) == 32
    except (ValueError, KeyError, IndexError, TypeError, OverflowError):
        ok = False
    if not ok:
        raise _problem(where, path, f"{field} is not a {Z85_KEY_LENGTH}-character Z85 key")


def read_public_key(path: str | Path, where: str) -> bytes:
    """The public key (Z85) of a certificate file (a `.key`, or a `.key_secret`)."""
    return _certificate(Path(path), where)[0]


def read_key_pair(path: str | Path, where: str) -> tuple[bytes, bytes]:
    """(public, secret) Z85 keys of a `.key_secret` file that only its owner can read."""
    path = Path(path)
    public, secret = _certificate(path, where)
    if secret is None:
        raise _problem(
            where, path, "holds no secret-key (a public .key file?); give the .key_secret file"
        )
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise _problem(
            where,
            path,
            f"secret key file has mode {mode:04o}: other users could read or replace it; "
            f"run `chmod 600 {path}`",
        )
    if zmq.curve_public(secret) != public:
        raise _problem(where, path, "public-key does not match secret-key")
    return public, secret


def read_allow_list(path: str | Path, where: str) -> frozenset[bytes]:
    """The client public keys (Z85) of a directory of `*.key` files, or of one key file."""
    path = Path(path)
    if not path.exists():
        raise _problem(where, path, "no such directory or key file")
    if not path.is_dir():
        return frozenset([read_public_key(path, where)])
    try:
        files = sorted(path.glob("*.key"))  # the files zmq.auth.load_certificates reads
    except OSError as exc:
        raise _problem(where, path, f"cannot list the directory: {exc.strerror or exc}") from None
    if not files:
        raise _problem(where, path, "holds no *.key public key files: no client could connect")
    return frozenset(read_public_key(f, where) for f in files)


# ---- from a config to one socket's keys ------------------------------------------------------

_READERS = {
    "server_secret_key": read_key_pair,
    "server_public_key": read_public_key,
    "client_secret_key": read_key_pair,
    "authorized_clients": read_allow_list,
}


def _key_files(
    config: Config, override: SecuritySection | None, override_key: str | None
) -> dict[str, tuple[Path, str]] | None:
    """field -> (resolved path, config key path) for one socket; None when CURVE is off."""
    if config.security is None and override is None:
        return None
    files: dict[str, tuple[Path, str]] = {}
    for section, prefix in ((config.security, "security"), (override, override_key)):
        for name in KEY_FIELDS:
            value = getattr(section, name) if section is not None else None
            if value is not None:
                files[name] = (config.base_dir / value, f"{prefix}.{name}")
    return files


def _load(files: dict[str, tuple[Path, str]], bind: bool, socket: str, override_key) -> Curve:
    needs = BIND_NEEDS if bind else CONNECT_NEEDS
    problems: list[str] = []
    for name in needs:
        if name not in files:
            where = "[security]" + (f" or {override_key}" if override_key else "")
            problems.append(
                f"{override_key or 'security'}.{name}: {socket} "
                f"{'binds' if bind else 'connects'} with CURVE and needs `{name}` in {where}"
            )
    loaded: dict[str, object] = {}
    for name in needs:
        if name in files:
            path, where = files[name]
            try:
                loaded[name] = _READERS[name](path, where)
            except SecurityError as exc:
                problems.extend(exc.problems)
    if problems:
        raise SecurityError(problems)
    if bind:
        public, secret = loaded["server_secret_key"]
        return Curve(public, secret, authorized=loaded["authorized_clients"])
    client_public, client_secret = loaded["client_secret_key"]
    return Curve(loaded["server_public_key"], None, client_public, client_secret)


def curve_for(
    config: Config,
    *,
    bind: bool,
    socket: str,
    override: SecuritySection | None = None,
    override_key: str | None = None,
) -> Curve | None:
    """The loaded keys of one socket (None: CURVE is off); SecurityError names every problem.

    bind: the socket binds (CURVE server) or connects (client). socket: a name for messages
    ("publish out"). override/override_key: the socket's own `security` table and its key path.
    """
    files = _key_files(config, override, override_key)
    if files is None:
        return None
    try:
        return _load(files, bind, socket, override_key)
    except SecurityError as exc:
        raise SecurityError([f"{config.path}: {line}" for line in exc.problems]) from None


def check_curve(
    config: Config,
    *,
    bind: bool,
    socket: str,
    override: SecuritySection | None = None,
    override_key: str | None = None,
) -> list[str]:
    """curve_for's problems as `key: problem` lines for a stage's check() (no file prefix)."""
    files = _key_files(config, override, override_key)
    if files is None:
        return []
    try:
        _load(files, bind, socket, override_key)
    except SecurityError as exc:
        return exc.problems
    return []


def stage_curve(stage, bind: bool) -> Curve | None:
    """curve_for a stage's socket: [security] overridden by its `security` option.

    stage: a pipeline.graph.Stage whose Options declare `security: SecuritySection | None`.
    """
    config = stage.context.config
    index = config.stage_names.index(stage.name)
    return curve_for(
        config,
        bind=bind,
        socket=f"{stage.kind} {stage.name}",
        override=stage.options.security,
        override_key=f"stages[{index}].security",
    )


def check_stage(cls, config: Config, index: int, bind: bool) -> list[str]:
    """check_curve for the socket of config.stages[index] (a Stage class cls), for its
    check(); its options have already passed cls.Options."""
    options = cls.Options.model_validate(config.stages[index].options)
    return check_curve(
        config,
        bind=bind,
        socket=f"{cls.kind} {config.stage_names[index]}",
        override=options.security,
        override_key=f"stages[{index}].security",
    )


def check_section(config: Config) -> list[str]:
    """Problems with the files [security] names, whichever sockets use them."""
    if config.security is None:
        return []
    problems = []
    for name, reader in _READERS.items():
        value = getattr(config.security, name)
        if value is not None:
            try:
                reader(config.base_dir / value, f"security.{name}")
            except SecurityError as exc:
                problems.extend(exc.problems)
    return problems


# ---- sockets --------------------------------------------------------------------------------


def is_loopback(endpoint: str) -> bool:
    """True when endpoint stays on this machine: tcp to 127.0.0.0/8, ::1, localhost or the
    `lo` interface, and ipc:// or inproc://. `*`, 0.0.0.0, other hosts and other transports
    are not."""
    transport, _, address = endpoint.partition("://")
    if transport in ("ipc", "inproc"):
        return True
    if transport != "tcp":
        return False
    address = address.rpartition(";")[2]  # tcp://SOURCE;HOST:PORT on connect
    host = address.rpartition(":")[0].strip("[]")
    if host in ("localhost", "lo"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _AllowList:
    """zmq.auth credentials provider: admits the client keys of one binding socket."""

    def __init__(self, keys: frozenset[bytes], socket: str) -> None:
        self.keys = keys
        self.socket = socket
        self.rejected = 0
        self._logged: set[bytes] = set()

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.keys:
            return True
        self.rejected += 1
        # A rejected client retries every reconnect interval: one line per key, not per try.
        if key not in self._logged and len(self._logged) < 100:
            self._logged.add(key)
            log.warning(
                "%s: rejected a client with unknown public key %s", self.socket, key.decode()
            )
        return False


class SocketSecurity:
    """CURVE (or plain) for the sockets of one zmq.Context, and their ZAP authenticator.

    bind()/connect() set a socket up for its role, then bind or connect it (zmq.ZMQError
    passes through as from the socket itself). close() stops the authenticator; call it
    before closing the context.
    """

    _domains = itertools.count()

    def __init__(self, ctx: zmq.Context, curve: Curve | None, socket: str) -> None:
        self.ctx = ctx
        self.curve = curve
        self.socket = socket
        self.allow_lists: list[_AllowList] = []
        self._auth: ThreadAuthenticator | None = None

    @property
    def rejected(self) -> int:
        """Handshakes the authenticator refused (clients with keys not on the allow-list)."""
        return sum(a.rejected for a in self.allow_lists)

    def bind(self, sock: zmq.Socket, endpoint: str) -> None:
        curve = self.curve
        if curve is None:
            if not is_loopback(endpoint):
                log.warning(
                    "%s: binds %s without CURVE: anyone who can reach it can connect and "
                    "read or send in clear (configure [security], docs/security.md)",
                    self.socket,
                    endpoint,
                )
        else:
            if curve.server_secret is None or curve.authorized is None:
                raise SecurityError([f"{self.socket}: binding needs the keys of bind=True"])
            allow = _AllowList(curve.authorized, self.socket)
            domain = f"npucam-{next(self._domains)}"
            if self._auth is None:
                self._auth = ThreadAuthenticator(self.ctx, log=log.getChild("zap"))
                self._auth.start()
            self._auth.configure_curve_callback(domain, allow)
            self.allow_lists.append(allow)
            sock.curve_secretkey = curve.server_secret
            sock.curve_publickey = curve.server_public
            sock.curve_server = True
            sock.zap_domain = domain.encode()
        sock.bind(endpoint)

    def connect(self, sock: zmq.Socket, endpoint: str) -> None:
        curve = self.curve
        if curve is None:
            if not is_loopback(endpoint):
                log.warning(
                    "%s: connects to %s without CURVE: traffic crosses the network in clear "
                    "(configure [security], docs/security.md)",
                    self.socket,
                    endpoint,
                )
        else:
            if curve.client_secret is None or curve.server_public is None:
                raise SecurityError([f"{self.socket}: connecting needs the keys of bind=False"])
            sock.curve_secretkey = curve.client_secret
            sock.curve_publickey = curve.client_public
            sock.curve_serverkey = curve.server_public
        sock.connect(endpoint)

    def close(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None


def add_client_key_args(parser: argparse.ArgumentParser, who: str) -> None:
    """The --server-key / --client-key flags of a command that connects to a publisher."""
    parser.add_argument(
        "--server-key",
        metavar="FILE",
        help="CURVE: the publisher's public key file (NAME.key); needs --client-key",
    )
    parser.add_argument(
        "--client-key",
        metavar="FILE",
        help=f"CURVE: this {who}'s key pair (NAME.key_secret, mode 0600), whose public key the "
        "publisher's authorized_clients lists; needs --server-key",
    )


def curve_of_args(args: argparse.Namespace, command: str) -> Curve | None:
    """The keys of add_client_key_args' flags; None without them, an error with only one."""
    if (args.server_key is None) != (args.client_key is None):
        raise SecurityError([f"{command}: CURVE needs both --server-key and --client-key"])
    if args.server_key is None:
        return None
    return client_curve(args.server_key, args.client_key)


def client_curve(server_key: str | Path, client_key: str | Path) -> Curve:
    """A connecting socket's keys from two files (the `npucam subscribe` flags)."""
    problems = []
    server_public = client = None
    try:
        server_public = read_public_key(server_key, "--server-key")
    except SecurityError as exc:
        problems.extend(exc.problems)
    try:
        client = read_key_pair(client_key, "--client-key")
    except SecurityError as exc:
        problems.extend(exc.problems)
    if problems:
        raise SecurityError(problems)
    return Curve(server_public, None, client[0], client[1])


# ---- key generation -------------------------------------------------------------------------


def generate_keys(name: str, directory: str | Path, force: bool = False) -> tuple[Path, Path]:
    """Write NAME.key (public, 0644) and NAME.key_secret (pair, 0600) into directory.

    The pair is written by zmq.auth.create_certificates into a private (0700) temporary
    directory beside the target, made 0600 there, then renamed into place, so the secret is
    never readable by others. Existing files are kept unless force.
    """
    if not re.fullmatch(NAME_PATTERN, name):
        raise SecurityError([f"key name {name!r}: use letters, digits, '_' and '-'"])
    directory = Path(directory)
    public, secret = directory / f"{name}.key", directory / f"{name}.key_secret"
    existing = [str(p) for p in (public, secret) if p.exists()]
    if existing and not force:
        raise SecurityError([f"{', '.join(existing)}: exists; not overwriting (use --force)"])
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=directory))
    except OSError as exc:
        raise SecurityError([f"{directory}: cannot create key files: {exc}"]) from None
    try:
        staged_public, staged_secret = zmq.auth.create_certificates(staging, name)
        os.chmod(staged_secret, 0o600)
        os.chmod(staged_public, 0o644)
        os.replace(staged_secret, secret)
        os.replace(staged_public, public)
    except OSError as exc:
        raise SecurityError([f"{directory}: cannot write key files: {exc}"]) from None
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
    return public, secret
