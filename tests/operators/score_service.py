"""A model server on 127.0.0.1 for map_async's and enrich_async's tests: ``score = amount %
97`` for a POSTed payment, a merchant's tier for ``GET /tier/<merchant>``."""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from time import sleep


class ScoreService:
    """A model server: ``score = amount % 97`` after 20 ms; txn ids ending in 7 are refused
    always (503), ids ending in 3 on their first call only; counts calls per id and the most
    in flight at once. With ``flaky`` (a seeded Random), each answer takes 5-60 ms instead and
    one call in five is refused (503) unless the id's previous call was: a caller retrying
    once more always gets an answer, so what reaches the sink does not depend on the luck.
    """

    def __init__(self, flaky: random.Random | None = None) -> None:
        self.flaky = flaky
        self.refused_last: set[str] = set()
        self.calls: Counter[str] = Counter()
        self.in_flight = self.most = 0
        self.lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802
                """``/tier/<merchant>``: the merchant's tier (``T<n % 3>``), merchant M7's
                refused always."""
                merchant = self.path.rsplit("/", 1)[-1]
                with service.lock:
                    service.calls[self.path] += 1
                if merchant == "M7":
                    self.send_response(503)
                    self.end_headers()
                    return
                answer = json.dumps({"tier": f"T{int(merchant[1:]) % 3}"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                txn = body["txn_id"]
                with service.lock:
                    service.calls[txn] += 1
                    first = service.calls[txn] == 1
                    service.in_flight += 1
                    service.most = max(service.most, service.in_flight)
                    luck = service.flaky.random() if service.flaky else None
                sleep(0.02 if luck is None else 0.005 + 0.055 * luck)
                with service.lock:
                    service.in_flight -= 1
                    unlucky = luck is not None and luck < 0.2 and txn not in service.refused_last
                    if unlucky:
                        service.refused_last.add(txn)
                    else:
                        service.refused_last.discard(txn)
                if txn.endswith("7") or (txn.endswith("3") and first) or unlucky:
                    self.send_response(503)
                    self.end_headers()
                    return
                answer = json.dumps({"score": body["amount_paise"] % 97}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # (5 by default: concurrent connects were refused)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
