'use strict';
// The README's Node example, run as written (an ES module importing the package by its name).
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { execFileSync } = require('node:child_process');

test("the README's Node example runs twice in a row against the local engine", () => {
  const readme = fs.readFileSync(path.join(__dirname, '../../../README.md'), 'utf8');
  const section = readme.slice(readme.indexOf('## Node'));
  const code = section.match(/```js\n([\s\S]*?)```/)[1];
  const env = { ...process.env, LEASELOCK_TABLE: `readme-${process.pid}-${Date.now().toString(36)}` };
  // The same table both times: the second run must not trip over what the first left.
  for (const fence of [1, 2]) {
    const out = execFileSync(process.execPath, ['--input-type=module', '-e', code], {
      cwd: path.join(__dirname, '..'),
      env,
      stdio: ['ignore', 'pipe', 'ignore'],
    }).toString();
    assert.match(out, new RegExp(`^held by worker-a until \\d+\nreport done under fence ${fence}\n$`));
  }
});
