#!/usr/bin/env python3
"""A loopback HTTP/1.1 keep-alive endpoint answering every DynamoDB request with one canned
UpdateItem response (``Content-Length``, ``x-amz-crc32``, and a ``Date`` as DynamoDB sends, which
the clients measure the store's clock by), and DescribeTable (the check before a first claim)
with a single-Region table: what a client costs per request without the TCP set-up the local
engine's ``Connection: close`` adds to each one.

usage: keepalive_server.py PORT   (prints "ready" once listening)
"""

import json
import sys
import time
import zlib
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The lease item after a successful claim or renewal (the reference schema's names).
BODY = json.dumps(
    {
        "Attributes": {
            "connection_id": {"S": "bench"},
            "desired_state": {"S": "STARTED"},
            "ws_url": {"S": "wss://feed.example/bench"},
            "lease_owner": {"S": "bench-owner"},
            "lease_expires_at_ms": {"N": str(int(time.time() * 1000) + 3_600_000)},
            "fence": {"N": "7"},
            "last_seq": {"N": "41"},
        }
    }
).encode()
# The whole response in one write: a header and a body in two small segments would meet the
# client's delayed ACK (Nagle) and stall every request by tens of milliseconds.
# What a claim checks first (a single-Region table: no replicas).
DESCRIBED = json.dumps({"Table": {"TableName": "bench", "TableStatus": "ACTIVE"}}).encode()


def head(body: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\n"
        b"Content-Type: application/x-amz-json-1.0\r\n"
        + f"Content-Length: {len(body)}\r\nx-amz-crc32: {zlib.crc32(body)}\r\n".encode()
        + b"x-amzn-RequestId: bench\r\n"
    )


HEADS = {BODY: head(BODY), DESCRIBED: head(DESCRIBED)}


def response(body: bytes = BODY) -> bytes:
    return HEADS[body] + f"Date: {formatdate(usegmt=True)}\r\n\r\n".encode() + body


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        described = self.headers.get("X-Amz-Target", "").endswith(".DescribeTable")
        self.wfile.write(response(DESCRIBED if described else BODY))

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    print("ready", flush=True)
    server.serve_forever()
