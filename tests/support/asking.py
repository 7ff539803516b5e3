"""What the tests of asking share: a worker-bridge-request block as a worker writes one, and a
mock script that reaches a name through the sandbox's proxy (retrying, for an approval that
comes while it runs)."""

from __future__ import annotations

import json
import textwrap

FENCE = "```"


def block(doc: dict) -> str:
    return f"{FENCE}worker-bridge-request\n{json.dumps(doc)}\n{FENCE}"


def py(code: str) -> str:
    return "python3 - <<'PYEOF'\n" + textwrap.dedent(code) + "\nPYEOF"


def reach(port: int, host: str = "vm", tries: int = 1, out: str = "probe.txt") -> str:
    """A mock script: CONNECT to HOST:PORT through the proxy up to TRIES times (0.2 s apart),
    then write what the last attempt got to OUT."""
    return py(
        f"""
        import re, socket, time
        def attempt():
            s = socket.create_connection(("127.0.0.1", 7801), timeout=20)
            s.sendall(b"CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n")
            head = b""
            while b"\\r\\n\\r\\n" not in head:
                chunk = s.recv(65536)
                if not chunk:
                    break
                head += chunk
            if b" 200 " not in head.split(b"\\r\\n")[0]:
                length = int(re.search(rb"content-length: *(\\d+)", head, re.I)[1])
                while len(head.partition(b"\\r\\n\\r\\n")[2]) < length:
                    if not (chunk := s.recv(65536)):  # the refusal's body; the connection
                        break  # stays open after it
                    head += chunk
                return "refused: " + head.decode(errors="replace")
            s.sendall(b"GET /asked HTTP/1.1\\r\\nHost: {host}\\r\\nConnection: close\\r\\n\\r\\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            return "reached: " + data.decode(errors="replace")
        for i in range({tries}):
            got = attempt()
            if got.startswith("reached"):
                break
            time.sleep(0.2)
        open("{out}", "w").write(got)
        """
    )


def net_config(port: int, *more: str) -> str:
    """config.yaml: the proxy may reach the test upstream's PORT on the host's loopback."""
    return (
        "gateway:\n"
        "  trusted_ranges: ['127.0.0.0/8']\n"
        f"  connect_ports: [{port}]\n"
        f"  http_ports: [{port}]\n" + "".join(f"  {line}\n" for line in more)
    )
