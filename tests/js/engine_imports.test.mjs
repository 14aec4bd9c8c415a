// Every engine module imports under Node without a DOM or WebGPU: globals such as
// GPUBufferUsage, navigator or document may only be touched inside functions.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { ENGINE } from './paths.mjs';

for (const file of fs.readdirSync(ENGINE).filter((f) => f.endsWith('.js')).sort()) {
  test(`engine/${file} imports without a DOM`, async () => {
    for (const name of ['window', 'document', 'navigator', 'GPUBufferUsage', 'GPUMapMode']) {
      assert.equal(name in globalThis, false, `${name} is defined here`);
    }
    await import(path.join(ENGINE, file));
  });
}

test('engine sources never touch the DOM', () => {
  for (const file of fs.readdirSync(ENGINE).filter((f) => f.endsWith('.js'))) {
    const src = fs.readFileSync(path.join(ENGINE, file), 'utf8').split('\n')
      .filter((line) => !/^\s*(\/\/|\*|\/\*)/.test(line)).join('\n');   // code, not comments
    assert.doesNotMatch(src, /\b(window|document)\.\w/, `${file} reaches for the DOM`);
    assert.doesNotMatch(src, /\bnavigator\.gpu\b/, `${file} picks its own GPU object`);
  }
});
