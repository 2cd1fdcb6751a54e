"""A connected socket handed to an exec'd program as fd 3 (inetd / `nc -e` / socat nofork style).
argv: peer_ip. The peer is kernel_peer.py 9001 (echo)."""
import os, socket, sys
s = socket.create_connection((sys.argv[1], 9001))
s.sendall(b"before-exec\n"); print("echo before exec:", s.recv(100), flush=True)
os.dup2(s.fileno(), 3)
os.set_inheritable(3, True)
os.execv("/bin/sh", ["sh", "-c", "echo from-exec >&3 && echo wrote-ok || echo write-failed; "
                     "timeout 3 head -c 10 <&3; echo \" read rc=$?\""])
