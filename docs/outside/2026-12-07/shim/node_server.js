// Under the shim: node's http and net servers on luna's address, plus a node client of a kernel server.
const http = require('http'), net = require('net'), crypto = require('crypto');
const IP = process.argv[2], PEER = process.argv[3];
const big = crypto.randomBytes(3 << 20);
const sha = crypto.createHash('sha256').update(big).digest('hex');
http.createServer((req, res) => {
  if (req.url === '/big') { res.end(big); return; }
  if (req.url === '/sha') { res.end(sha); return; }
  if (req.method === 'POST') {
    const h = crypto.createHash('sha256'); let n = 0;
    req.on('data', d => { h.update(d); n += d.length; });
    req.on('end', () => res.end(`${n} ${h.digest('hex')}`));
    return;
  }
  res.end('hello\n');
}).listen(8080, IP, () => console.log('http ready'));
net.createServer(c => { c.pipe(c); c.on('error', e => console.log('echo err', e.code)); }).listen(8081, IP);
// client side: node as a luna client of the kernel echo (9001)
setTimeout(() => {
  const c = net.connect(9001, PEER);
  const data = crypto.randomBytes(2 << 20); let got = [];
  c.on('connect', () => { c.write(data); });
  c.on('data', d => { got.push(d); if (Buffer.concat(got).length >= data.length) {
    console.log('client echo', Buffer.concat(got).equals(data) ? 'OK' : 'MISMATCH'); c.end(); } });
  c.on('error', e => console.log('client error', e.code));
  const r = net.connect(9999, PEER); r.on('error', e => console.log('refused ->', e.code));
}, 1500);
setTimeout(() => process.exit(0), +(process.argv[4] || 60) * 1000);
