// Drives pdserve's HTTP API with the official OpenAI Node.js client (test_openai.py copies this
// file next to the installed package and compares what it prints with the gRPC API's results).
// Usage: node openai_client.mjs BASE_URL MODEL PROMPT MESSAGES_JSON
import OpenAI from 'openai';

const [baseURL, model, prompt, messagesJson] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'not-checked', maxRetries: 0 });
const messages = JSON.parse(messagesJson);
const out = {};

const c = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0 });
out.completion = { text: c.choices[0].text, finish_reason: c.choices[0].finish_reason, usage: c.usage };

let text = '';
let chunks = 0;
for await (const chunk of await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0, stream: true })) {
  text += chunk.choices[0]?.text ?? '';
  chunks += 1;
}
out.completion_stream = { text, chunks };

const cc = await client.chat.completions.create({ model, messages, max_tokens: 10, temperature: 0 });
out.chat = { content: cc.choices[0].message.content, role: cc.choices[0].message.role, usage: cc.usage };

let content = '';
let usage = null;
const stream = await client.chat.completions.create({
  model, messages, max_tokens: 10, temperature: 0, stream: true, stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  if (chunk.choices.length > 0) content += chunk.choices[0].delta.content ?? '';
  if (chunk.usage) usage = chunk.usage;
}
out.chat_stream = { content, usage };

out.models = (await client.models.list()).data.map((m) => m.id);
out.retrieved = await client.models.retrieve(model);
try {
  await client.models.retrieve('no-such-model');
} catch (e) {
  out.retrieve_missing = { status: e.status, code: e.code };
}

// Most chat clients send no max_tokens.
const unbounded = await client.chat.completions.create({ model, messages, temperature: 0 });
out.chat_unbounded = { content: unbounded.choices[0].message.content, usage: unbounded.usage };

try {
  await client.completions.create({ model: 'no-such-model', prompt, max_tokens: 2 });
} catch (e) {
  out.not_found = { status: e.status, code: e.code, param: e.param, type: e.type };
}
try {
  await client.chat.completions.create({ model, messages: [], max_tokens: 2 });
} catch (e) {
  out.bad_request = { status: e.status, param: e.param };
}
console.log(JSON.stringify(out));
