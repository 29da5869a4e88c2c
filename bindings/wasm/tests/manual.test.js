'use strict';
// The manual's Node samples (every ```js block of docs/src/*.md, in the book's order; then the
// package README's), each run as written (an ES module importing the package by its name)
// against the local engine, twice in a row on the same table. A table name 'leases' in a sample
// is replaced by this run's own. The API page's Node sample runs twice more, with what it prints
// checked.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');

const pages = path.join(__dirname, '../../../docs/src');

function samples() {
  const summary = fs.readFileSync(path.join(pages, 'SUMMARY.md'), 'utf8');
  const found = [];
  for (const [, name] of summary.matchAll(/\]\((\w[\w-]*\.md)\)/g)) {
    const text = fs.readFileSync(path.join(pages, name), 'utf8');
    for (const [, code] of text.matchAll(/^```js\n([\s\S]*?)^```$/gm)) found.push({ page: name, code });
  }
  return found;
}

test("the manual's Node samples run twice in a row against the local engine", () => {
  const all = samples();
  assert.ok(all.length > 0, 'no Node sample in the manual');
  const table = `manual-${process.pid}-${Date.now().toString(36)}`;
  for (const run of [1, 2]) {
    all.forEach(({ page, code }, i) => {
      const done = spawnSync(process.execPath, ['--input-type=module', '-e', code.replaceAll("'leases'", `'${table}'`)], {
        cwd: path.join(__dirname, '..'),
        env: process.env,
        encoding: 'utf8',
        timeout: 180_000,
      });
      assert.equal(done.status, 0, `run ${run}, ${page} sample ${i + 1}:\n${code}\n--- stderr:\n${done.stderr}`);
    });
  }
  console.log(`${all.length} Node samples of the manual ran twice`);
});

test("the API page's Node sample runs twice in a row and prints what it says", () => {
  const page = fs.readFileSync(path.join(pages, 'api-reference.md'), 'utf8');
  const start = page.indexOf('\n## Node\n');
  assert.ok(start >= 0, 'no Node section on the API page');
  const section = page.slice(start);
  const code = section.match(/^```js\n([\s\S]*?)^```$/m)[1];
  const env = { ...process.env, LEASELOCK_TABLE: `api-${process.pid}-${Date.now().toString(36)}` };
  // The same table both times: the second run must not trip over what the first left.
  for (const fence of [1, 2]) {
    const done = spawnSync(process.execPath, ['--input-type=module', '-e', code], {
      cwd: path.join(__dirname, '..'),
      env,
      encoding: 'utf8',
      timeout: 180_000,
    });
    assert.equal(done.status, 0, `run ${fence}:\n--- stderr:\n${done.stderr}`);
    assert.match(done.stdout, new RegExp(`^held by worker-a until \\d+\nreport done under fence ${fence}\n$`));
  }
});

test("the package README's Node samples run twice in a row against the local engine", () => {
  const readme = fs.readFileSync(path.join(__dirname, '../README.md'), 'utf8');
  const all = [...readme.matchAll(/^```js\n([\s\S]*?)^```$/gm)].map((m) => m[1]);
  assert.ok(all.length > 0, 'no Node sample in bindings/wasm/README.md');
  const table = `package-readme-${process.pid}-${Date.now().toString(36)}`;
  for (const run of [1, 2]) {
    all.forEach((code, i) => {
      const done = spawnSync(process.execPath, ['--input-type=module', '-e', code.replaceAll("'leases'", `'${table}'`)], {
        cwd: path.join(__dirname, '..'),
        env: process.env,
        encoding: 'utf8',
        timeout: 180_000,
      });
      assert.equal(done.status, 0, `run ${run}, bindings/wasm/README.md sample ${i + 1}:\n--- stderr:\n${done.stderr}`);
    });
  }
});
