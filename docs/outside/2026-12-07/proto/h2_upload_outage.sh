#!/bin/sh
# One client: C connections (default 3) x 100 concurrent streams, each uploading 60,000
# bytes to /echo (h2load). Each session stalls (see h2_upload_stall.sh) holding ~5 MB of
# received DATA, zero-copy, i.e. ~3,100 receive mbufs of the 8,191-mbuf pool. With 3
# connections the pool is empty and the whole server stops receiving: other clients cannot
# connect and luna no longer answers ARP/ping.
# Usage: NS=<prefix>-tap [C=3] sh h2_upload_outage.sh    (luna-h2 on the tap topology)
NS=${NS:-ph2-tap}; C=${C:-3}
head -c 60000 /dev/urandom > /tmp/b60k
ip netns exec $NS ping -c1 -W1 198.18.0.2 > /dev/null && echo "before: ping ok"
ip netns exec $NS timeout 25 h2load -n 1000 -c $C -m 100 -d /tmp/b60k http://198.18.0.2:8080/echo > /tmp/h2load-outage.out 2>&1 &
sleep 5
for i in 1 2 3; do
  printf "t+%ss other client: HTTP " $((5 + (i - 1) * 6))
  ip netns exec $NS timeout 4 curl -sS -m 3 --http2-prior-knowledge -o /dev/null -w "%{http_code}\n" http://198.18.0.2:8080/ 2>/dev/null | tail -1
  ip netns exec $NS ping -c 1 -W 1 198.18.0.2 > /dev/null && echo "   ping ok" || echo "   ping: no answer"
  sleep 1
done
wait
grep -E "requests:" /tmp/h2load-outage.out || echo "h2load: hung (killed by timeout after 25 s)"
echo "after h2load has gone, polling every 10 s for up to ${WAIT:-180} s:"
t=0; while [ $t -lt ${WAIT:-180} ]; do
  if ip netns exec $NS timeout 3 curl -s -m 2 --http2-prior-knowledge -o /dev/null http://198.18.0.2:8080/; then echo "served again ~${t}s after the client left"; exit 0; fi
  sleep 7; t=$((t + 10))
done
echo "still unreachable ${WAIT:-180}s after the client left"
