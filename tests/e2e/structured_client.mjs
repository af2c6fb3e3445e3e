// Structured outputs through the official OpenAI Node.js client (test_structured_outputs.py copies
// this file next to the installed package): response_format with a JSON schema, JSON mode,
// tool_choice "required" and a named function, and a bad schema's error.
// Usage: node structured_client.mjs BASE_URL MODEL SCHEMA_JSON
import OpenAI from 'openai';

const [baseURL, model, schemaJson] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'not-checked', maxRetries: 0 });
const schema = JSON.parse(schemaJson);
const messages = [{ role: 'user', content: 'Describe a person.' }];
const out = { schema: [], json_object: [], required: [], named: [] };

for (let seed = 0; seed < 6; seed++) {
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 120, temperature: 1, seed,
    response_format: { type: 'json_schema', json_schema: { name: 'person', schema, strict: true } },
  });
  out.schema.push({ content: r.choices[0].message.content, finish_reason: r.choices[0].finish_reason });
}
for (let seed = 0; seed < 3; seed++) {
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 120, temperature: 1, seed, response_format: { type: 'json_object' },
  });
  out.json_object.push({ content: r.choices[0].message.content, finish_reason: r.choices[0].finish_reason });
}
const tools = [
  { type: 'function', function: { name: 'get_weather', parameters: { type: 'object',
    properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'] } } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object',
    properties: { zone: { enum: ['utc', 'local'] } }, required: ['zone'] } } },
];
for (let seed = 0; seed < 4; seed++) {
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 120, temperature: 1, seed, tools, tool_choice: 'required',
    parallel_tool_calls: seed >= 2,  // One call: the grammar ends after it (a model this small may not).
  });
  out.required.push({ message: r.choices[0].message, finish_reason: r.choices[0].finish_reason });
  let calls = [];
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 120, temperature: 1, seed, tools, stream: true,
    tool_choice: { type: 'function', function: { name: 'get_time' } },
  });
  let finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices[0]?.delta?.tool_calls ?? []) calls.push(c);
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  out.named.push({ calls, finish_reason: finish });
}
try {
  await client.chat.completions.create({
    model, messages, max_tokens: 4,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'integer', minimum: 3 } } },
  });
} catch (e) {
  out.bad_schema = { status: e.status, param: e.param, type: e.type, message: e.message };
}
console.log(JSON.stringify(out));
