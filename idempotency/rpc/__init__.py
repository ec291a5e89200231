"""idempotency.rpc: msgpack-rpc over netframe long connections, with idempotency keys.

Layout: ``_protocol`` is sans-IO (messages, the idempotency extension, error shapes,
the framed and plain-stream decoders); the client and server build on it and on
:mod:`netframe`. This file only re-exports.
"""

from ._client import CallResult as CallResult
from ._client import Client as Client
from ._client import ClientStatistics as ClientStatistics
from ._client import RetryPolicy as RetryPolicy
from ._client import RetryThrottle as RetryThrottle
from ._dispatch import ServerStatistics as ServerStatistics
from ._errors import CallTimeout as CallTimeout
from ._errors import RPCError as RPCError
from ._errors import Unavailable as Unavailable
from ._protocol import EXTENSION_VERSION as EXTENSION_VERSION
from ._protocol import HELLO_METHOD as HELLO_METHOD
from ._protocol import MAX_MSGID as MAX_MSGID
from ._protocol import NOTIFICATION as NOTIFICATION
from ._protocol import PEER_EXCEPTION as PEER_EXCEPTION
from ._protocol import PEER_VALIDATION as PEER_VALIDATION
from ._protocol import REQUEST as REQUEST
from ._protocol import RESPONSE as RESPONSE
from ._protocol import CallMeta as CallMeta
from ._protocol import ErrorInfo as ErrorInfo
from ._protocol import Limits as Limits
from ._protocol import LocalProtocolError as LocalProtocolError
from ._protocol import Message as Message
from ._protocol import MessageTooLarge as MessageTooLarge
from ._protocol import Notification as Notification
from ._protocol import ProtocolError as ProtocolError
from ._protocol import RemoteProtocolError as RemoteProtocolError
from ._protocol import Request as Request
from ._protocol import Response as Response
from ._protocol import Status as Status
from ._protocol import StreamDecoder as StreamDecoder
from ._protocol import decode as decode
from ._protocol import encode as encode
from ._protocol import encode_error as encode_error
from ._protocol import encode_notification as encode_notification
from ._protocol import encode_plain_error as encode_plain_error
from ._protocol import encode_request as encode_request
from ._protocol import encode_response as encode_response
from ._protocol import encode_response_payloads as encode_response_payloads
from ._protocol import parse as parse
from ._protocol import parse_error as parse_error
from ._protocol import plain_error as plain_error
from ._server import Server as Server

# The public names, for `from idempotency.rpc import *` and the generated reference.
__all__ = [
    "MAX_MSGID",
    "NOTIFICATION",
    "REQUEST",
    "RESPONSE",
    "CallMeta",
    "CallResult",
    "CallTimeout",
    "Client",
    "ClientStatistics",
    "ErrorInfo",
    "Limits",
    "LocalProtocolError",
    "Message",
    "MessageTooLarge",
    "Notification",
    "ProtocolError",
    "RPCError",
    "RemoteProtocolError",
    "Request",
    "Response",
    "RetryPolicy",
    "RetryThrottle",
    "Server",
    "ServerStatistics",
    "Status",
    "StreamDecoder",
    "Unavailable",
    "decode",
    "encode",
    "encode_error",
    "encode_notification",
    "encode_plain_error",
    "encode_request",
    "encode_response",
    "encode_response_payloads",
    "parse",
    "parse_error",
    "plain_error",
]
