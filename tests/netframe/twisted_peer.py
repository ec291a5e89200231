"""A Twisted Int32StringReceiver peer, run as a subprocess by test_interop_twisted.py.

python twisted_peer.py server          prints "PORT <n>", echoes every string
python twisted_peer.py client PORT N   sends N strings of varying sizes, checks the
                                       echoes in order, prints "OK <n>" and exits 0
"""

from __future__ import annotations

import sys

from twisted.internet import protocol, reactor  # type: ignore[import-not-found]
from twisted.protocols.basic import Int32StringReceiver  # type: ignore[import-not-found]


def payload(i: int) -> bytes:
    return bytes((i * 7 + k) % 256 for k in range((i * 37) % 5000))


class Echo(Int32StringReceiver):  # type: ignore[misc]
    MAX_LENGTH = 1 << 20

    def stringReceived(self, data: bytes) -> None:
        self.sendString(data)


class Checker(Int32StringReceiver):  # type: ignore[misc]
    MAX_LENGTH = 1 << 20

    def __init__(self, n: int) -> None:
        self.n = n
        self.got = 0

    def connectionMade(self) -> None:
        for i in range(self.n):
            self.sendString(payload(i))

    def stringReceived(self, data: bytes) -> None:
        if data != payload(self.got):
            print(f"MISMATCH at {self.got}", flush=True)
            reactor.stop()
            return
        self.got += 1
        if self.got == self.n:
            print(f"OK {self.got}", flush=True)
            self.transport.loseConnection()
            reactor.stop()


def main() -> None:
    if sys.argv[1] == "server":
        factory = protocol.ServerFactory.forProtocol(Echo)
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        print(f"PORT {port.getHost().port}", flush=True)
        reactor.run()
    else:
        port, n = int(sys.argv[2]), int(sys.argv[3])
        factory = protocol.ClientFactory()
        factory.protocol = lambda: Checker(n)
        reactor.connectTCP("127.0.0.1", port, factory)
        reactor.callLater(60, reactor.stop)
        reactor.run()


if __name__ == "__main__":
    main()
