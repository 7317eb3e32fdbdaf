"""A round trip between the laptop and each box, for the benchmark: a TCP proxy on 127.0.0.1 in
front of a box's SSH port that holds every chunk `one_way_ms` in each direction, in order (what a
WAN or a busy VPN does to pyinfra's SSH commands). The sim's kernel has no netem qdisc
(`tc qdisc ... netem` answers "Specified qdisc kind is unknown"), so the delay is added here.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class DelayProxy:
    """127.0.0.1:<port> -> 127.0.0.1:<target>, every byte delayed `one_way_ms` each way."""

    def __init__(self, target: int, one_way_ms: float):
        self.target, self.delay = target, one_way_ms / 1000
        self.open = set()  # both ends of every connection: closed with the proxy, so a box's
        # sshd sees its session end (a run's lock on the box goes with it)
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)

    def _serve(self, ready):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._connection, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _connection(self, client_reader, client_writer):
        try:
            box_reader, box_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            client_writer.close()
            return
        self.open.update((client_writer, box_writer))
        try:
            await asyncio.gather(self._pipe(client_reader, box_writer),
                                 self._pipe(box_reader, client_writer), return_exceptions=True)
        finally:
            for writer in (client_writer, box_writer):
                writer.close()
                self.open.discard(writer)

    async def _pipe(self, reader, writer):
        queue: asyncio.Queue = asyncio.Queue()

        async def take():
            while True:
                data = await reader.read(65536)
                await queue.put((self.loop.time() + self.delay, data))
                if not data:
                    return

        async def give():
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - self.loop.time()))
                if not data:
                    with contextlib.suppress(OSError):
                        writer.close()
                    return
                writer.write(data)
                await writer.drain()

        await asyncio.gather(take(), give())

    def close(self):
        async def stop():
            self.server.close()
            for writer in list(self.open):
                writer.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.loop.stop()

        asyncio.run_coroutine_threadsafe(stop(), self.loop)
        self.thread.join(5)
        self.loop.close()


@contextlib.contextmanager
def round_trip(ports: dict, rtt_ms: float):
    """{host: local port with a round trip of `rtt_ms` to that host's SSH port} while inside."""
    proxies = {host: DelayProxy(port, rtt_ms / 2) for host, port in ports.items()}
    try:
        yield {host: proxy.port for host, proxy in proxies.items()}
    finally:
        for proxy in proxies.values():
            proxy.close()
