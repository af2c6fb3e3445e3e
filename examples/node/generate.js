#!/usr/bin/env node
// Streams a generation from a pdserve router (or `pdserve serve`) with Node.js gRPC.
//
//   cd examples/node && npm install
//   node generate.js --server localhost:8000 --prompt "Hello"
//
// The proto is loaded at run time with @grpc/proto-loader: no code generation step.
"use strict";
const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

function parseArgs(argv) {
  const args = { server: "localhost:8000", maxTokens: 32, temperature: 0, json: false };
  for (let i = 2; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--server") args.server = argv[++i];
    else if (a === "--prompt") args.prompt = argv[++i];
    else if (a === "--max-tokens") args.maxTokens = Number(argv[++i]);
    else if (a === "--temperature") args.temperature = Number(argv[++i]);
    else if (a === "--json") args.json = true;
    else throw new Error(`unknown argument ${a}`);
  }
  if (args.prompt === undefined) throw new Error("--prompt is required");
  return args;
}

const args = parseArgs(process.argv);
const protoDir = path.join(__dirname, "..", "..", "proto");
const definition = protoLoader.loadSync(path.join(protoDir, "pdserve/v1/generation.proto"), {
  includeDirs: [protoDir],
  keepCase: true,
  longs: String,
  defaults: true,
  oneofs: true,
});
const pdserve = grpc.loadPackageDefinition(definition).pdserve.v1;
const client = new pdserve.Generation(args.server, grpc.credentials.createInsecure());

const result = { token_ids: [], text: "", finish_reason: "" };
const call = client.Generate({
  text: args.prompt,
  sampling: { temperature: args.temperature, max_tokens: args.maxTokens },
}, { deadline: Date.now() + 300000 });
call.on("data", (response) => {
  result.token_ids.push(...response.token_ids);
  result.text += response.text;
  if (!args.json) process.stdout.write(response.text);
  if (response.finish_reason) result.finish_reason = response.finish_reason;
});
call.on("error", (err) => {
  console.error(`pdserve: ${err.code} ${err.details}`);
  process.exit(1);
});
call.on("end", () => {
  console.log(args.json ? JSON.stringify(result) : "");
});
