"""A whole answer within the stall timeout: headers and body, however slowly they trickle.

requests' read timeout bounds each socket read, so a registry (or a token service) that sends one byte a
second never trips it: a push or a pre-flight would wait for hours. Here each request's answer must be
complete within SECONDS of the request having been sent (its body, an upload, included: the clock starts
when the connection asks for the answer, `getresponse`). When the time is up the connection's socket is
shut down, the read under way fails, and `answer_within` says it was the deadline.

It works below requests, in urllib3: `DeadlineAdapter` gives the session connection pools whose
connections tell the current thread's watch when they start reading an answer.
"""
from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from typing import Iterator, Optional

from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

_current = threading.local()


class Watch:
    """One request's deadline: armed when its connection starts reading the answer (again on a redirect)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.fired = False
        self._timer: Optional[threading.Timer] = None
        self._lock = threading.Lock()

    def attach(self, conn: HTTPConnection) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(self.seconds, self._fire, args=(conn,))
            self._timer.daemon = True
            self._timer.start()

    def _fire(self, conn: HTTPConnection) -> None:
        self.fired = True
        sock = getattr(conn, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cancel(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None


def _watched(conn: HTTPConnection) -> None:
    watch = getattr(_current, "watch", None)
    if watch is not None:
        watch.attach(conn)


class _Connection(HTTPConnection):
    def getresponse(self, *args, **kwargs):
        _watched(self)
        return super().getresponse(*args, **kwargs)


class _TLSConnection(HTTPSConnection):
    def getresponse(self, *args, **kwargs):
        _watched(self)
        return super().getresponse(*args, **kwargs)


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Connection


class _TLSPool(HTTPSConnectionPool):
    ConnectionCls = _TLSConnection


class DeadlineAdapter(HTTPAdapter):
    """A requests adapter whose connections are watched (mount it for http:// and https://)."""

    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _Pool, "https": _TLSPool}

    def proxy_manager_for(self, *args, **kwargs):
        manager = super().proxy_manager_for(*args, **kwargs)
        manager.pool_classes_by_scheme = {"http": _Pool, "https": _TLSPool}
        return manager


@contextmanager
def answer_within(seconds: float) -> Iterator[Watch]:
    """Requests made in this block by sessions with a DeadlineAdapter get their whole answer within
    SECONDS of being sent, or their socket is shut; `watch.fired` says which (check it on any error)."""
    watch = Watch(seconds)
    before = getattr(_current, "watch", None)
    _current.watch = watch
    try:
        yield watch
    finally:
        watch.cancel()
        _current.watch = before


def watched_session():
    """A requests session whose answers `answer_within` bounds."""
    import requests
    session = requests.Session()
    adapter = DeadlineAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
