"""HTTP/3 interoperability check with a client that is not Weir's: aioquic (PyPI).

Sends a GET and a POST with a body to a running Weir over HTTP/3 and checks the answers:
status 200 for both, and (against an echo upstream) the POST body back at the end of the
response. Exits non-zero on any failure. Run through bench/h3-interop.sh.

Usage: python h3_interop.py HOST PORT SERVER_NAME [CA_FILE]
"""

import asyncio
import ssl
import sys

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.waiting = {}

    def quic_event_received(self, event):
        for e in self.h3.handle_event(event):
            answer = self.waiting.get(getattr(e, "stream_id", None))
            if answer is None:
                continue
            if isinstance(e, HeadersReceived):
                answer["headers"] += e.headers
            elif isinstance(e, DataReceived):
                answer["body"] += e.data
            if getattr(e, "stream_ended", False):
                answer["done"].set_result(None)

    async def request(self, method, authority, path, body=b""):
        stream = self._quic.get_next_available_stream_id()
        headers = [
            (b":method", method.encode()),
            (b":scheme", b"https"),
            (b":authority", authority.encode()),
            (b":path", path.encode()),
        ]
        if body:
            headers.append((b"content-length", str(len(body)).encode()))
        answer = {"headers": [], "body": b"", "done": self._loop.create_future()}
        self.waiting[stream] = answer
        self.h3.send_headers(stream, headers, end_stream=not body)
        if body:
            self.h3.send_data(stream, body, end_stream=True)
        self.transmit()
        await asyncio.wait_for(answer["done"], 10)
        status = dict(answer["headers"]).get(b":status", b"?").decode()
        return status, answer["body"]


async def main(host, port, name, ca):
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name=name)
    if ca:
        config.load_verify_locations(ca)
    else:
        config.verify_mode = ssl.CERT_NONE
    async with connect(host, port, configuration=config, create_protocol=Client) as client:
        status, body = await client.request("GET", name, "/interop")
        print(f"GET /interop: {status}, {len(body)} bytes")
        assert status == "200", status
        status, body = await client.request("POST", name, "/interop", b"hello from aioquic")
        print(f"POST /interop: {status}, {len(body)} bytes")
        assert status == "200", status
        assert body.endswith(b"hello from aioquic"), body[-64:]
    print("aioquic interop: OK")


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) < 3:
        sys.exit(__doc__)
    asyncio.run(main(args[0], int(args[1]), args[2], args[3] if len(args) > 3 else None))
