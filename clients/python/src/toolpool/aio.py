"""The asyncio client: the synchronous client's methods as coroutines, each run in a worker thread
(asyncio.to_thread), so that an event loop is never blocked and only the standard library is needed."""

from __future__ import annotations

import asyncio
import functools
from typing import Any, AsyncIterator, Callable, Iterator, Optional

from .client import Client
from .models import Event

_DONE = object()


class AsyncClient:
    """The same methods as :class:`Client` (same arguments, same exceptions), awaited:
    ``await tp.call(...)``, ``await tp.approve(id)``; ``events`` and ``stream`` are async iterators
    (``async for ev in tp.stream(...)``) that resume after a dropped connection like the sync ones."""

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, **kw: Any) -> None:
        self.sync = Client(url, token, **kw)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = getattr(self.sync, name)
        if name.startswith("_") or not callable(fn):
            return fn

        @functools.wraps(fn)
        async def run(*args: Any, **kw: Any) -> Any:
            return await asyncio.to_thread(fn, *args, **kw)

        return run

    def events(self, call_id: str, **kw: Any) -> AsyncIterator[Event]:
        return _aiter(lambda: self.sync.events(call_id, **kw))

    def stream(self, tool: str, args: Any = None, **kw: Any) -> AsyncIterator[Event]:
        return _aiter(lambda: self.sync.stream(tool, args, **kw))


async def _aiter(make: Callable[[], Iterator[Event]]) -> AsyncIterator[Event]:
    it = await asyncio.to_thread(make)
    try:
        while True:
            ev = await asyncio.to_thread(next, it, _DONE)
            if ev is _DONE:
                return
            yield ev
    finally:
        await asyncio.to_thread(getattr(it, "close", lambda: None))
