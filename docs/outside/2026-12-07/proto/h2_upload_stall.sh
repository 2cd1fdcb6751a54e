#!/bin/sh
# Six concurrent 1,000,000-byte uploads (each under luna-h2's 1 MiB max_body) on ONE
# HTTP/2 connection deadlock: the session withholds the connection window once more than
# max_buffered (4 MiB) of incomplete bodies are buffered, and a body is only released
# when its stream completes, which needs window. 4 or 5 streams pass; 6 hang until the
# idle timeout (75 s) ends the connection.
# Usage (luna-h2 on the tap topology with prefix P): NS=P-tap sh h2_upload_stall.sh
NS=${NS:-ph2-tap}
head -c 1000000 /dev/urandom > /tmp/body1m
for m in 5 6; do
  echo "== $m concurrent uploads on one connection"
  ip netns exec $NS timeout ${T:-20} h2load -n $m -c 1 -m $m -d /tmp/body1m http://198.18.0.2:8080/echo 2>&1 | grep -E "requests:|status codes" || echo "HUNG (timeout ${T:-20}s)"
done
# nghttpd / nginx / h2o serve this: an HTTP/2 server must not let the connection window
# depend on requests completing when every open stream needs more window to complete.

# Same stall with small bodies: 100 concurrent streams (= the advertised
# MAX_CONCURRENT_STREAMS) each uploading 60,000 bytes (below even the 65,535-byte
# initial stream window) on one connection: 6 MB of incomplete bodies > 4 MiB + 1 MiB.
head -c 60000 /dev/urandom > /tmp/b60k
for m in 80 100; do
  echo "== $m concurrent 60 KB uploads on one connection"
  ip netns exec $NS timeout ${T:-20} h2load -n 1000 -c 1 -m $m -d /tmp/b60k http://198.18.0.2:8080/echo 2>&1 | grep -E "requests:|status codes" || echo "HUNG (timeout ${T:-20}s)"
done
