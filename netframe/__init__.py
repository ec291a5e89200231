"""netframe: length-prefixed framing over byte streams and long-connection servers.

Built on :mod:`gosim`. The sans-IO codec, ``FramedConn``, ``Server`` and the client
arrive with their issue; this package is importable so the layering is fixed from the
first commit.
"""
