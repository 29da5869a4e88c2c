'use strict';
// A keep-alive loopback HTTP/1.1 endpoint answering every request with one canned DynamoDB
// JSON response (Content-Length and x-amz-crc32 set), so client CPU per request can be measured
// without the local engine's per-request connection. Run as a child process: prints its port.
const http = require('node:http');
const zlib = require('node:zlib');

const body = Buffer.from(process.argv[2] ?? '{}');
const headers = {
  'content-type': 'application/x-amz-json-1.0',
  'content-length': String(body.length),
  'x-amz-crc32': String(zlib.crc32 ? zlib.crc32(body) : crc32(body)),
  'x-amzn-requestid': 'bench',
  connection: 'keep-alive',
};

function crc32(buf) {
  let c = ~0;
  for (const b of buf) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = (c >>> 1) ^ (0xedb88320 & -(c & 1));
  }
  return (~c) >>> 0;
}

const server = http.createServer({ keepAliveTimeout: 60_000 }, (req, res) => {
  req.resume();
  req.on('end', () => {
    res.writeHead(200, headers);
    res.end(body);
  });
});
server.listen(0, '127.0.0.1', () => {
  process.send?.({ port: server.address().port });
});
process.on('disconnect', () => process.exit(0));
