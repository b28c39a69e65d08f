"""Services a test owns outright, so it can restart or cut them: a private redis-server, a
private PostgreSQL cluster, and a TCP proxy that can drop every connection (a database or broker
outage, seen from the workers)."""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from helpers import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateRedis:
    """A redis-server on its own port that keeps nothing on disk: a restart wipes it."""

    def __init__(self, workdir: Path, password: str | None = None, tls: bool = False,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.extra_args = extra_args
        self.password = password
        self.workdir = workdir
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls:
            ca = self.workdir / "redis-cert.pem"
            return (f"rediss://{auth}127.0.0.1:{self.port}/0"
                    f"?ssl_cert_reqs=required&ssl_ca_certs={ca}")
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def _tls_args(self) -> list[str]:
        cert, key = self.workdir / "redis-cert.pem", self.workdir / "redis-key.pem"
        if not cert.exists():
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                            "-keyout", str(key), "-out", str(cert), "-days", "1",
                            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                           check=True, capture_output=True)
        return ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(cert),
                "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
                "--tls-auth-clients", "no"]

    def start(self) -> "PrivateRedis":
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        args = [binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.workdir)]
        args += self._tls_args() if self.tls else ["--port", str(self.port)]
        if self.password:
            args += ["--requirepass", self.password]
        args += list(self.extra_args)
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._up, 10, f"redis-server on port {self.port}")
        return self

    def client(self):  # type: ignore[no-untyped-def]
        import redis

        return redis.Redis.from_url(self.url)

    def _up(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self, down_s: float = 1.0) -> None:
        """Kill -9 and start again: every queued and unacked message is gone."""
        self.stop()
        time.sleep(down_s)
        self.start()


class PrivatePostgres:
    """A PostgreSQL cluster of its own (initdb in a scratch directory, its own port), so a test
    can crash and restart the server itself without touching the machine's shared one."""

    def __init__(self) -> None:
        versions = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
        if not versions:
            raise RuntimeError("PostgreSQL server binaries not found under /usr/lib/postgresql")
        self.bin = Path(versions[-1])
        self.port = free_port()
        # Not under pytest's tmp_path: that is private to root, and the server runs as postgres.
        self.dir = Path(tempfile.mkdtemp(prefix="examforge-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.env: dict[str, str] | None = None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, env: dict[str, str] | None = None) -> None:
        # initdb and postgres refuse to run as root: run them as the postgres user then.
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if env:  # through env(1): runuser starts its command with a clean environment
            prefix += ["env", *(f"{k}={v}" for k, v in env.items())]
        subprocess.run(prefix + list(args), check=True, capture_output=True, timeout=120)

    def start(self, env: dict[str, str] | None = None) -> "PrivatePostgres":
        """`env`: the server's environment (libfaketime's, for a clock of its own)."""
        if env is not None:
            self.env = env
        if not self.data.exists():
            if os.geteuid() == 0:
                shutil.chown(self.dir, "postgres", "postgres")
            self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                      "--auth=trust", "--no-sync")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w",
                  "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1", "start",
                  env=self.env)
        return self

    def configure(self, **settings: str) -> "PrivatePostgres":
        """Lines added to postgresql.conf, read at the next start (or reload)."""
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.writelines(f"{name} = '{value}'\n" for name, value in settings.items())
        return self

    def replica(self, env: dict[str, str] | None = None) -> "PrivatePostgres":
        """A streaming replica of this (running) server, made the way PostgreSQL's manual
        says: `pg_basebackup -R` (standby.signal and primary_conninfo written), started as a
        hot standby on a port of its own, with `env` (as `start`). Issue 34."""
        standby = PrivatePostgres()
        if os.geteuid() == 0:
            shutil.chown(standby.dir, "postgres", "postgres")
        self._run(str(self.bin / "pg_basebackup"), "-D", str(standby.data), "-h", "127.0.0.1",
                  "-p", str(self.port), "-U", "postgres", "-R", "-X", "stream",
                  "--checkpoint=fast", "--no-sync")
        return standby.start(env)

    def reload(self) -> "PrivatePostgres":
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "reload")
        return self

    def stop_streaming(self) -> None:
        """A standby stops receiving the primary's WAL (its primary_conninfo emptied and
        reloaded): from now on it lags, as an asynchronous replica behind a slow link does."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                             dbname="postgres", autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
            conn.execute("SELECT pg_reload_conf()")

        def stopped() -> bool:
            with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                                 dbname="postgres") as conn:
                row = conn.execute("SELECT count(*) FROM pg_stat_wal_receiver").fetchone()
            return bool(row) and row[0] == 0

        wait_for(stopped, 15, "the standby's WAL receiver to stop")

    def promote(self) -> None:
        """`pg_ctl promote -w`: the standby leaves recovery and takes writes."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "promote")

    def crash(self) -> None:
        """Stop the way a crash does: `immediate` kills every backend at once, no checkpoint,
        open transactions are lost, and the next start replays the WAL."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def restart(self, down_s: float = 3.0) -> None:
        self.crash()
        time.sleep(down_s)
        self.start()

    def stop(self) -> None:
        try:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w",
                      "stop")
        except subprocess.CalledProcessError:
            pass  # not running
        shutil.rmtree(self.dir, ignore_errors=True)


class TcpProxy:
    """127.0.0.1:port -> target. `cut()` resets every connection and refuses new ones until
    `restore()`: what a restarting server looks like from its clients."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> "TcpProxy":
        self._thread.start()
        self._call(self._listen())
        return self

    def _call(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port,
                                                  reuse_address=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    async def _cut(self) -> None:
        if self._server:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            w.transport.abort()
        self._writers.clear()

    def cut(self) -> None:
        self._call(self._cut())

    def restore(self) -> None:
        self._call(self._listen())

    async def _shutdown(self) -> None:
        await self._cut()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def stop(self) -> None:
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


class PrivateSentinel:
    """`redis-server --sentinel` on its own port, watching one master under `name` (issue 34).
    Quorum 1 and a short down-after, so one Sentinel alone declares the master down and
    promotes its replica within a couple of seconds."""

    def __init__(self, workdir: Path, master_port: int, name: str = "ef",
                 down_after_ms: int = 1000, password: str | None = None) -> None:
        self.port = free_port()
        self.name = name
        self.password = password
        self.config = workdir / f"sentinel-{self.port}.conf"
        self.log = workdir / f"sentinel-{self.port}.log"
        lines = [f"port {self.port}", "bind 127.0.0.1", f"dir {workdir}", f"logfile {self.log}",
                 f"sentinel monitor {name} 127.0.0.1 {master_port} 1",
                 f"sentinel down-after-milliseconds {name} {down_after_ms}",
                 f"sentinel failover-timeout {name} 10000",
                 f"sentinel parallel-syncs {name} 1"]
        if password:
            lines.append(f"requirepass {password}")
        # Sentinel rewrites its file as it learns (replicas, the new master): it must be its own.
        self.config.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sentinel://127.0.0.1:{self.port}"

    def start(self) -> "PrivateSentinel":
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.proc = subprocess.Popen([binary, str(self.config), "--sentinel"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: self.master() is not None, 10, f"sentinel on port {self.port}")
        return self

    def client(self):  # type: ignore[no-untyped-def]
        import redis

        return redis.Redis(port=self.port, password=self.password, socket_timeout=2)

    def master(self) -> tuple[str, int] | None:
        """Where the Sentinel says the master is now (None: it cannot be asked)."""
        try:
            addr = self.client().sentinel_get_master_addr_by_name(self.name)
        except Exception:  # noqa: BLE001 (not up yet)
            return None
        if not addr:
            return None
        host = addr[0].decode() if isinstance(addr[0], bytes) else str(addr[0])
        return host, int(addr[1])

    def replicas_known(self) -> int:
        try:
            return len(self.client().sentinel_slaves(self.name))
        except Exception:  # noqa: BLE001
            return 0

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
