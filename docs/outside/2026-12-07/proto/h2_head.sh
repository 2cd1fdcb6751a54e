#!/bin/sh
# HEAD over HTTP/2: luna-h2 sends the body in DATA frames after a HEADERS without
# END_STREAM (RFC 9110 §9.3.2: a HEAD response has no content). curl and nghttp reset the
# stream with PROTOCOL_ERROR, so every HEAD request fails.
NS=${NS:-ph2-tap}
ip netns exec $NS timeout 10 curl -sS --http2-prior-knowledge -I http://198.18.0.2:8080/big; echo "curl exit=$?"
ip netns exec $NS timeout 10 nghttp -v -H ':method: HEAD' http://198.18.0.2:8080/ 2>&1 | grep -E "recv (HEADERS|DATA)|RST_STREAM|error_code"
