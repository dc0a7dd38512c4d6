"""A self-signed certificate for 127.0.0.1, made with the openssl CLI (no extra Python package)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def self_signed(directory: Path, name: str = "server") -> tuple[Path, Path]:
    """(certfile, keyfile) of a fresh self-signed certificate valid for 127.0.0.1 and localhost."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )
    return cert, key
