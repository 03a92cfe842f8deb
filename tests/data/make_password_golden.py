#!/usr/bin/env python3
"""Writes password-golden.json: a password protector record built from docs/formats.md alone
(argon2-cffi and cryptography, not dirseal), so a test proves dirseal reads the documented format.
Run: python3 tests/data/make_password_golden.py > tests/data/password-golden.json"""
import json

from argon2.low_level import Type, hash_secret_raw
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

pid = "0123456789abcdef"
salt = bytes(range(16))
t, m, p = 1, 1024, 1
nonce = bytes(range(100, 112))
protector_key = bytes(range(200, 232))
kek = hash_secret_raw(b"correct horse", salt, time_cost=t, memory_cost=m, parallelism=p, hash_len=32, type=Type.ID)
aad = f"dirseal:1:protector:{pid}:password:{salt.hex()}:{t}:{m}:{p}".encode()
ct = AESGCM(kek).encrypt(nonce, protector_key, aad)
print(json.dumps({
    "format": "dirseal-protector", "version": 1, "id": pid, "name": "alice", "uid": 1000,
    "kind": {"type": "password", "salt": salt.hex(), "argon2": {"time_cost": t, "memory_kib": m, "parallelism": p}},
    "wrapped_key": {"nonce": nonce.hex(), "ciphertext": ct.hex()},
}, indent=2))
