// The tokenizer oracle: @lenml/tokenizers (a port of the Hugging Face tokenizers of
// transformers.js), which nobody here wrote. For each {"text": ...} line of the corpus prints
// {"ids", "ids_special", "decoded", "decoded_skip"}.
//
// Usage: node oracle.js NODE_MODULES_DIR TOKENIZER_DIR CORPUS_JSONL
"use strict";
const fs = require("fs");
const path = require("path");

const [nodeModules, tokenizerDir, corpusPath] = process.argv.slice(2);
const { TokenizerLoader } = require(path.resolve(nodeModules, "@lenml/tokenizers"));
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(tokenizerDir, "tokenizer.json"), "utf8")),
  tokenizerConfig: JSON.parse(fs.readFileSync(path.join(tokenizerDir, "tokenizer_config.json"), "utf8")),
});
// The oracle refuses to decode an empty list; the answer is "".
const decode = (ids, skip) => (ids.length === 0 ? "" : tokenizer.decode(ids, { skip_special_tokens: skip }));
const out = [];
for (const line of fs.readFileSync(corpusPath, "utf8").split("\n")) {
  if (!line) continue;
  const text = JSON.parse(line).text;
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  const idsSpecial = tokenizer.encode(text, { add_special_tokens: true });
  out.push(JSON.stringify({
    ids,
    ids_special: idsSpecial,
    decoded: decode(ids, false),
    decoded_skip: decode(idsSpecial, true),
  }));
}
process.stdout.write(out.join("\n") + "\n");
