// The independent Llama-3 tokenizer for the compatibility test, from the npm package llama3-tokenizer-js.
//   node llama3_reference.mjs MODULES_DIR vocab OUT.model   writes its vocabulary as a tiktoken file
//   node llama3_reference.mjs MODULES_DIR encode IN.json    prints its ids for a JSON array of strings
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [modules, mode, file] = process.argv.slice(2);
const entry = join(modules, 'node_modules', 'llama3-tokenizer-js', 'bundle', 'llama3-tokenizer-with-baked-data.js');
const tokenizer = (await import(pathToFileURL(entry).href)).default;

if (mode === 'vocab') {
  // The package stores tokens in the GPT-2 byte-to-character mapping; undo it to get the raw bytes.
  const printable = [];
  for (let b = 0x21; b <= 0x7e; ++b) printable.push(b);
  for (let b = 0xa1; b <= 0xac; ++b) printable.push(b);
  for (let b = 0xae; b <= 0xff; ++b) printable.push(b);
  const characterToByte = new Map();
  let shifted = 0;
  for (let b = 0; b < 256; ++b) {
    if (printable.includes(b)) characterToByte.set(String.fromCharCode(b), b);
    else characterToByte.set(String.fromCharCode(256 + shifted++), b);
  }
  const lines = [];
  for (let rank = 0; rank < 128000; ++rank) {
    const bytes = Array.from(tokenizer.vocabById[rank], (c) => {
      if (!characterToByte.has(c)) throw new Error(`token ${rank} has an unexpected character`);
      return characterToByte.get(c);
    });
    lines.push(`${Buffer.from(bytes).toString('base64')} ${rank}`);
  }
  writeFileSync(file, lines.join('\n') + '\n');
} else if (mode === 'encode') {
  const strings = JSON.parse(readFileSync(file, 'utf8'));
  const ids = strings.map((s) => tokenizer.encode(s, { bos: false, eos: false }));
  process.stdout.write(JSON.stringify(ids));
} else {
  throw new Error(`unknown mode ${mode}: expected vocab or encode`);
}
