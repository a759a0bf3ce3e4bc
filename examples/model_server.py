"""A fraud model's scoring server for the map_async example: ``POST /score`` with a payment's
JSON answers ``{"score": 0-96}`` after ``--latency-ms`` (asyncio, HTTP/1.1 keep-alive).

    python examples/model_server.py --port 8700 &
    srt run examples/scored_payments.py --available-now
"""

from __future__ import annotations

import argparse
import asyncio
import json


def score(payment: dict) -> int:
    """The model: a stand-in whose answer a test can compute."""
    return int(payment["amount_paise"]) % 97


async def serve(port: int, latency_s: float, host: str = "127.0.0.1") -> None:
    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                payment = json.loads(await reader.readexactly(length))
                await asyncio.sleep(latency_s)
                answer = json.dumps({"score": score(payment)}).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + b"Content-Length: %d\r\n\r\n" % len(answer)
                    + answer
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, KeyError):
            writer.close()

    server = await asyncio.start_server(connection, host, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8700)
    p.add_argument("--latency-ms", type=float, default=20.0)
    a = p.parse_args()
    asyncio.run(serve(a.port, a.latency_ms / 1000))


if __name__ == "__main__":
    main()
