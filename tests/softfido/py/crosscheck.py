"""Drives the software authenticator with an independent client (Yubico's python-fido2) over its
unix socket, so the authenticator is not only ever checked by the code it serves.

usage: crosscheck.py SOCKET PIN SALT_HEX
Sets the PIN (clientPIN setPIN), registers a credential with hmac-secret and user verification,
verifies the packed self-attestation and the assertion signature with fido2.server, and prints
JSON: {"credential_id": hex, "output": hex of the hmac-secret for SALT (user verified),
"protocol": PIN protocol used, "retries": retries after one wrong PIN}.
"""
import json
import socket
import sys

from fido2.client import Fido2Client, UserInteraction
from fido2.ctap import CtapError
from fido2.ctap2 import Ctap2
from fido2.ctap2.pin import ClientPin
from fido2.hid import CtapHidDevice
from fido2.hid.base import CtapHidConnection, HidDescriptor
from fido2.server import Fido2Server
from fido2.attestation import PackedAttestation

REPORT = 64


class SocketConnection(CtapHidConnection):
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.settimeout(20)

    def write_packet(self, data):
        assert len(data) == REPORT
        self.sock.sendall(data)

    def read_packet(self):
        buf = b""
        while len(buf) < REPORT:
            chunk = self.sock.recv(REPORT - len(buf))
            if not chunk:
                raise OSError("authenticator closed the connection")
            buf += chunk
        return buf

    def close(self):
        self.sock.close()


class Pin(UserInteraction):
    def __init__(self, pin):
        self.pin = pin

    def request_pin(self, permissions, rp_id):
        return self.pin


def main():
    path, pin, salt = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
    desc = HidDescriptor(path, 0, 0, REPORT, REPORT, "softfido", None)
    dev = CtapHidDevice(desc, SocketConnection(path))
    ctap = Ctap2(dev)
    assert "hmac-secret" in ctap.info.extensions, ctap.info
    client_pin = ClientPin(ctap)
    client_pin.set_pin(pin)
    try:
        client_pin.get_pin_token(pin + "x")
        raise SystemExit("a wrong PIN was accepted")
    except CtapError as e:
        assert e.code == CtapError.ERR.PIN_INVALID, e
    retries = client_pin.get_pin_retries()[0]
    client_pin.get_pin_token(pin)  # the right PIN resets the count

    server = Fido2Server({"id": "example.com", "name": "Example"}, attestation="direct")
    client = Fido2Client(dev, "https://example.com", user_interaction=Pin(pin))
    options, state = server.register_begin(
        {"id": b"user-1", "name": "alice", "displayName": "Alice"}, user_verification="required"
    )
    pk = dict(options["publicKey"])
    pk["extensions"] = {"hmacCreateSecret": True}
    made = client.make_credential(pk)
    assert made.extension_results.get("hmacCreateSecret") is True, made.extension_results
    att = made.attestation_object
    assert att.fmt == "packed", att.fmt
    PackedAttestation().verify(att.att_stmt, att.auth_data, made.client_data.hash)
    auth_data = server.register_complete(state, made.client_data, att)
    creds = [auth_data.credential_data]

    options, state = server.authenticate_begin(creds, user_verification="required")
    pk = dict(options["publicKey"])
    pk["extensions"] = {"hmacGetSecret": {"salt1": salt}}
    got = client.get_assertion(pk).get_response(0)
    server.authenticate_complete(state, creds, got.credential_id, got.client_data, got.authenticator_data, got.signature)
    assert got.authenticator_data.is_user_verified()
    out = got.extension_results["hmacGetSecret"]["output1"]
    print(json.dumps({
        "credential_id": auth_data.credential_data.credential_id.hex(),
        "output": out.hex(),
        "protocol": client_pin.protocol.VERSION,
        "retries": retries,
    }))


if __name__ == "__main__":
    main()
