"""The wheels a resolution names, fetched from the index in parallel, each checked against the lock.

uv's resolution (toolchain/wheels/resolver.py) gives each pin's wheel files as PEP 751 lists them: the URL,
the size and the sha256 the index published. The pool's missing wheels are fetched here straight from
those URLs, several at once: pip's download, one file at a time in one process, took 75 s for the
example's 3.9 GiB, these streams 14 s (docs/benchmarks.md). Each file is
written under a temporary name beside its place in the pool, hashed as it arrives, and renamed into
place only when its size and sha256 are the lock's: a wheel the pool holds is always the lock's bytes.

What cannot be fetched here (the index refused it, it kept failing after the retries, the lock names no
URL or no sha256 for it) is returned to the caller, which hands it to pip; a file whose bytes are not the
lock's is an error naming it, and nothing of it is kept. An index that needs credentials answers 401 to
the lock's URLs, which carry none: pip fetches those with its own settings (PIP_INDEX_URL, netrc).
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from toolchain.errors import WheelhouseError
from toolchain.progress import Reporter, human_bytes

WORKERS = 6            # streams at once: the example's 56 wheels, torch and the CUDA libraries among them
ATTEMPTS = 3           # of a file whose stream broke off (a connection's own errors are retried below it)
CHUNK = 1 << 20
TIMEOUT_S = (15, 60)   # to connect; between two reads
PART = ".part"         # a download under way: `.<wheel>.<random>.part` in the pool


@dataclass(frozen=True)
class WheelFile:
    """One wheel of a pin, as the lock lists it."""
    name: str          # its file name
    url: str
    sha256: str        # hex, as the index published it
    size: Optional[int] = None


class _Refused(Exception):
    """The index would not give this file (a status that asks for another client: pip, with its settings)."""


class _Stopped(Exception):
    """Another file failed, or the build was interrupted: this one is abandoned."""


def _umask() -> int:
    """This process's umask, read without setting it (os.umask sets it, for every thread at once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _session() -> requests.Session:
    s = requests.Session()
    # the certificates uv (SSL_CERT_FILE) or pip (PIP_CERT) is told to trust, unless requests' own variables
    # name some (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE: requests reads those itself); proxies: *_PROXY, as both
    ca = os.environ.get("SSL_CERT_FILE") or os.environ.get("PIP_CERT")
    if ca and not (os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")):
        s.verify = ca
    retry = Retry(total=4, connect=4, read=2, status=4, backoff_factor=0.5, status_forcelist=(429, 500, 502, 503, 504),
                  allowed_methods=("GET",), raise_on_status=False)
    adapter = HTTPAdapter(max_retries=retry, pool_connections=WORKERS, pool_maxsize=WORKERS)
    s.mount("https://", adapter)
    s.mount("http://", adapter)
    return s


class _Counter:
    def __init__(self, rep: Reporter, what: str, total: int):
        self.rep, self.what, self.total, self.done = rep, what, total, 0
        self.lock = threading.Lock()

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n
            self.rep.progress(self.what, self.done, self.total)


def _fetch_one(session: requests.Session, pool: Path, wheel: WheelFile, counter: _Counter, mode: int,
               stop: threading.Event) -> None:
    """WHEEL into the pool (file mode MODE), or _Refused / WheelhouseError / _Stopped; nothing of it is left in
    the pool on an error."""
    last: Optional[Exception] = None
    for attempt in range(ATTEMPTS):
        fd, tmp = tempfile.mkstemp(prefix=f".{wheel.name}.", suffix=PART, dir=pool)
        os.fchmod(fd, mode)  # as any file the user writes (mkstemp's is 0600): a pool another user reads too
        got = 0
        try:
            with os.fdopen(fd, "wb") as out, session.get(wheel.url, stream=True, timeout=TIMEOUT_S) as res:
                if res.status_code != 200:
                    raise _Refused(f"HTTP {res.status_code}")
                digest = hashlib.sha256()
                for chunk in res.iter_content(CHUNK):
                    if stop.is_set():
                        raise _Stopped()
                    out.write(chunk)
                    digest.update(chunk)
                    got += len(chunk)
                    counter.add(len(chunk))
            if wheel.size is not None and got != wheel.size:
                raise WheelhouseError(f"{wheel.name} from {wheel.url}: {got} bytes, where the lock says {wheel.size}; "
                                      "nothing was kept (the index served another file: try again, or pin another "
                                      "version)")
            if digest.hexdigest() != wheel.sha256:
                raise WheelhouseError(f"{wheel.name} from {wheel.url}: its sha256 is {digest.hexdigest()}, where the "
                                      f"lock says {wheel.sha256}; nothing was kept (the index served another file)")
            os.replace(tmp, pool / wheel.name)
            return
        except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as e:
            last = e
            counter.add(-got)
            time.sleep(0.5 * (attempt + 1))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise _Refused(f"{type(last).__name__} after {ATTEMPTS} attempts")


def fetch(pool: Path, wheels: list[WheelFile], rep: Reporter, what: str) -> tuple[list[str], dict[str, str]]:
    """Fetch WHEELS into POOL, WORKERS at a time: (the names fetched, {name: why} of those not fetched, for the
    caller's pip). A file whose bytes are not the lock's is a WheelhouseError; the others stop."""
    if not wheels:
        return [], {}
    for stale in pool.glob(f".*{PART}"):  # a download killed before its rename (the callers hold the pool's lock)
        stale.unlink(missing_ok=True)
    total = sum(w.size or 0 for w in wheels)
    counter = _Counter(rep, f"{what}: downloading {len(wheels)} wheel(s)", total)
    rep.progress(counter.what, 0, total)
    t0 = time.monotonic()
    session, stop, mode = _session(), threading.Event(), 0o666 & ~_umask()
    done: list[str] = []
    left: dict[str, str] = {}
    executor = ThreadPoolExecutor(min(WORKERS, len(wheels)), thread_name_prefix="wheel-download")
    try:
        # the biggest first: the last to finish is not a big one started late
        jobs = {w.name: executor.submit(_fetch_one, session, pool, w, counter, mode, stop)
                for w in sorted(wheels, key=lambda w: -(w.size or 0))}
        for name, job in jobs.items():
            try:
                job.result()
                done.append(name)
            except _Refused as e:
                left[name] = str(e)
    except BaseException:  # a file not the lock's, or Ctrl-C: the other downloads stop at their next chunk
        stop.set()
        raise
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
        session.close()
        rep.progress_done()
    seconds = time.monotonic() - t0
    got = sum(w.size or (pool / w.name).stat().st_size for w in wheels if w.name in done)
    rep.detail(f"{what}: {len(done)} wheel(s), {human_bytes(got)} downloaded in {seconds:.1f}s "
               f"({human_bytes(got / max(seconds, 1e-6))}/s), each checked against the lock's sha256")
    return sorted(done), left
