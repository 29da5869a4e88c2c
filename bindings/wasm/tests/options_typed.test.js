'use strict';
// Every option `new LeaseTable({...})` accepts (bindings/wasm/src/config.rs) is typed in
// index.d.ts, and index.d.ts types no option the package refuses.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');

const root = path.join(__dirname, '..');

test('LeaseTableOptions in index.d.ts names exactly the options the package accepts', () => {
  const rust = fs.readFileSync(path.join(root, 'src/config.rs'), 'utf8');
  const list = rust.match(/const OPTIONS: &\[&str\] = &\[([\s\S]*?)\];/)[1];
  const accepted = [...list.matchAll(/"(\w+)"/g)].map((m) => m[1]).concat(['client']).sort();
  const dts = fs.readFileSync(path.join(root, 'index.d.ts'), 'utf8');
  const body = dts.match(/export interface LeaseTableOptions \{([\s\S]*?)\n\}/)[1];
  const typed = [...body.matchAll(/^ {2}(\w+)\??:/gm)].map((m) => m[1]).sort();
  assert.deepEqual(typed, accepted);
});
