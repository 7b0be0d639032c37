// The official OpenAI client library (npm "openai") against a live fpa-serve's HTTP API.
import assert from "node:assert/strict";
import net from "node:net";
import { after, before, test } from "node:test";
import OpenAI from "openai";

import { MODEL_NAME, eventually, startServer } from "./daemon.mjs";

const servers = [];
process.on("exit", () => servers.forEach((s) => s.stop()));

async function server(...flags) {
  const s = await startServer(...flags);
  servers.push(s);
  return s;
}

function clientOf(s) {
  return new OpenAI({ baseURL: `${s.base}/v1`, apiKey: "unused", maxRetries: 0, timeout: 60000 });
}

const LONG_PROMPT = "The grass is green. The sky is blue. The sun is yellow. ".repeat(30);
let shared, client;

before(async () => {
  shared = await server();
  client = clientOf(shared);
});
after(() => servers.forEach((s) => s.stop()));

test("a completion: greedy text, finish reason, usage with the cache figures", async () => {
  const prompt = "The pass key is";
  const r = await client.completions.create({
    model: MODEL_NAME, prompt, max_tokens: 8, temperature: 0, logprobs: 0,
  });
  assert.equal(r.object, "text_completion");
  assert.equal(r.model, MODEL_NAME);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].finish_reason, "length");
  assert.equal(r.choices[0].logprobs.token_logprobs.length, 8);
  assert.ok(r.choices[0].logprobs.token_logprobs.every((x) => x <= 0));
  // One-byte characters (control characters included) are their own text, not "bytes:\x0A".
  const lp = (await client.completions.create({
    model: MODEL_NAME, prompt: "The grass is green. The sky is", max_tokens: 32, temperature: 0,
    logprobs: 0,
  })).choices[0].logprobs;
  assert.ok(lp.tokens.every((t) => !/^bytes:\\x[0-7]/.test(t)), JSON.stringify(lp.tokens));
  assert.ok(lp.tokens.some((t) => t.length === 1 && t.charCodeAt(0) < 0x20), "no control character");
  assert.equal(r.usage.prompt_tokens, 1 + prompt.length); // [BOS] + bytes
  assert.equal(r.usage.completion_tokens, 8);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 8);
  assert.ok(r.usage.live_fraction > 0 && r.usage.live_fraction <= 1);
  assert.ok(r.usage.cache_bytes_held > 0 && r.usage.cache_bytes_full > 0);
  // The same prompt as token ids ([BOS] = 256, then the bytes) gives the same greedy text.
  const ids = [256, ...Buffer.from(prompt)];
  const again = await client.completions.create({
    model: MODEL_NAME, prompt: ids, max_tokens: 8, temperature: 0,
  });
  assert.equal(again.choices[0].text, r.choices[0].text);
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), [MODEL_NAME]);
});

test("a streamed completion with usage: the same text, then usage, then [DONE]", async () => {
  const body = { model: MODEL_NAME, prompt: "There and back again.", max_tokens: 12,
                 temperature: 0.8, seed: 7 };
  const whole = await client.completions.create(body);
  const stream = await client.completions.create({
    ...body, stream: true, stream_options: { include_usage: true },
  });
  let text = "", usage = null, reasons = [];
  for await (const chunk of stream) {
    if (chunk.choices.length) {
      text += chunk.choices[0].text;
      reasons.push(chunk.choices[0].finish_reason);
    } else {
      usage = chunk.usage;
    }
  }
  assert.equal(text, whole.choices[0].text);
  assert.equal(reasons.at(-1), whole.choices[0].finish_reason);
  assert.ok(reasons.slice(0, -1).every((r) => r === null));
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);
  assert.ok(usage.live_fraction > 0);
  // On the wire: Server-Sent Events ending in "data: [DONE]".
  const raw = await fetch(`${shared.base}/v1/completions`, {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ ...body, stream: true }),
  });
  assert.match(raw.headers.get("content-type"), /^text\/event-stream/);
  const events = (await raw.text()).split("\n\n").filter(Boolean);
  assert.equal(events.at(-1), "data: [DONE]");
  assert.ok(events.slice(0, -1).every((e) => e.startsWith("data: {")));
});

// The greedy text of `prompt` and a stop string of two printable ASCII characters in it (two
// tokens of the byte tokenizer: a stop split across tokens), with where it first occurs.
async function greedyWithStop(prompt) {
  const body = { model: MODEL_NAME, prompt, max_tokens: 24, temperature: 0, ignore_eos: true };
  const text = (await client.completions.create(body)).choices[0].text;
  const printable = (c) => c >= " " && c <= "~";
  const i = [...text].findIndex((c, k, all) => k > 0 && printable(c) && printable(all[k + 1] ?? ""));
  assert.ok(i > 0, `no printable pair in ${JSON.stringify(text)}`);
  const stop = [...text].slice(i, i + 2).join("");
  return { body, text, stop, at: text.indexOf(stop) };
}

async function streamed(body) {
  const stream = await client.completions.create({ ...body, stream: true });
  let text = "", reason = null;
  for await (const chunk of stream) {
    text += chunk.choices[0].text;
    reason = chunk.choices[0].finish_reason ?? reason;
  }
  return { text, reason };
}

test("a stop string is trimmed from the text, plain and streamed, even split across tokens",
     async () => {
  const { body, text, stop, at } = await greedyWithStop("The pass key is");
  const plain = await client.completions.create({ ...body, stop: [stop] });
  assert.equal(plain.choices[0].text, text.slice(0, at));
  assert.equal(plain.choices[0].finish_reason, "stop");
  const s = await streamed({ ...body, stop });
  assert.deepEqual(s, { text: text.slice(0, at), reason: "stop" });
  // vLLM's include_stop_str_in_output keeps it.
  const kept = await client.completions.create({ ...body, stop, include_stop_str_in_output: true });
  assert.equal(kept.choices[0].text, text.slice(0, at + stop.length));
  const keptStream = await streamed({ ...body, stop, include_stop_str_in_output: true });
  assert.equal(keptStream.text, text.slice(0, at + stop.length));
  // A stop that never occurs: held-back text is released at the end.
  const never = await streamed({ ...body, stop: [stop[0] + "\u0001\u0002"] });
  assert.deepEqual(never, { text, reason: "length" });
});

test("stop_token_ids end generation; the stop token's text is trimmed unless kept", async () => {
  const { body, text, stop } = await greedyWithStop("The pass key is");
  const id = stop.charCodeAt(0); // the byte tokenizer: ids 0-255 are the bytes
  const plain = await client.completions.create({ ...body, stop_token_ids: [id] });
  assert.equal(plain.choices[0].text, text.slice(0, text.indexOf(stop[0])));
  assert.equal(plain.choices[0].finish_reason, "stop");
  const s = await streamed({ ...body, stop_token_ids: [id] });
  assert.deepEqual(s, { text: text.slice(0, text.indexOf(stop[0])), reason: "stop" });
  const kept = await streamed({ ...body, stop_token_ids: [id], include_stop_str_in_output: true });
  assert.equal(kept.text, text.slice(0, text.indexOf(stop[0]) + 1));
  const err = await client.completions.create({ ...body, stop_token_ids: [1 << 20] })
    .then(() => null, (e) => e);
  assert.equal(err?.status, 400);
  assert.equal(err.param, "stop_token_ids");
});

test("chat completions, plain and streamed, through the default (ChatML) template", async () => {
  const messages = [
    { role: "system", content: "You are terse." },
    { role: "user", content: [{ type: "text", text: "Name a colour." }] },
  ];
  const body = { model: MODEL_NAME, messages, max_completion_tokens: 12, temperature: 0 };
  const chat = await client.chat.completions.create(body);
  assert.equal(chat.object, "chat.completion");
  assert.match(chat.id, /^chatcmpl-/);
  assert.equal(chat.choices[0].message.role, "assistant");
  // The same as a completion of the documented template's prompt.
  const prompt = "<|im_start|>system\nYou are terse.<|im_end|>\n" +
    "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n";
  const same = await client.completions.create({
    model: MODEL_NAME, prompt, max_tokens: 12, temperature: 0, stop: ["<|im_end|>"],
  });
  assert.equal(chat.choices[0].message.content, same.choices[0].text);
  assert.equal(chat.choices[0].finish_reason, same.choices[0].finish_reason);
  assert.equal(chat.usage.prompt_tokens, same.usage.prompt_tokens);
  const stream = await client.chat.completions.create({
    ...body, stream: true, stream_options: { include_usage: true }, logprobs: true,
  });
  let text = "", roles = [], reason = null, usage = null, lps = 0;
  for await (const chunk of stream) {
    assert.equal(chunk.object, "chat.completion.chunk");
    if (!chunk.choices.length) {
      usage = chunk.usage;
      continue;
    }
    const c = chunk.choices[0];
    text += c.delta.content ?? "";
    if (c.delta.role) roles.push(c.delta.role);
    lps += c.logprobs?.content.length ?? 0;
    reason = c.finish_reason ?? reason;
  }
  assert.equal(text, chat.choices[0].message.content);
  assert.deepEqual(roles, ["assistant"]);
  assert.equal(reason, chat.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, chat.usage.completion_tokens);
  assert.equal(lps, chat.usage.completion_tokens);
  const err = await client.chat.completions
    .create({ model: MODEL_NAME, messages: [{ content: "hi" }] }).then(() => null, (e) => e);
  assert.equal(err?.status, 400);
  assert.equal(err.param, "messages[0].role");
});

// The id of a byte-tokenizer token as logprobs.tokens spells it (a character, bytes:\xNN or
// <special:N>).
function tokenId(t) {
  const special = t.match(/^<special:(\d+)>$/);
  if (special) return Number(special[1]);
  const byte = t.match(/^bytes:\\x([0-9A-F]{2})$/);
  if (byte) return parseInt(byte[1], 16);
  assert.equal(t.length, 1, t);
  return t.charCodeAt(0);
}

// The penalties' rules, applied to the model's own top-20 log-probabilities that the server
// reports at each step (before penalties, as vLLM's): its greedy pick must be their argmax.
test("presence and frequency penalties change greedy output as OpenAI specifies", async () => {
  const body = {
    model: MODEL_NAME, prompt: "The grass is green. The grass is", max_tokens: 24, temperature: 0,
    logprobs: 20, ignore_eos: true, eviction_policy: "none",
  };
  const plain = (await client.completions.create(body)).choices[0];
  const rules = { presence_penalty: 0.7, frequency_penalty: 0.6 };
  const penalized = (await client.completions.create({ ...body, ...rules })).choices[0];
  assert.notEqual(penalized.text, plain.text);
  const { tokens, top_logprobs: top } = penalized.logprobs;
  const counts = new Map();
  tokens.forEach((token, i) => {
    let best = null, bestScore = -Infinity;
    for (const [t, lp] of Object.entries(top[i])) {
      const n = counts.get(t) ?? 0;
      const score = lp - rules.frequency_penalty * n - (n > 0 ? rules.presence_penalty : 0);
      if (score > bestScore) [best, bestScore] = [t, score];
    }
    // Penalties only lower scores: a token outside the top 20 cannot beat this one.
    assert.ok(bestScore >= Math.min(...Object.values(top[i])), `step ${i}`);
    assert.equal(token, best, `step ${i}`);
    counts.set(token, (counts.get(token) ?? 0) + 1);
  });
  // logit_bias and min_tokens: a banned token never appears; nothing ends before min_tokens.
  const banned = plain.logprobs.tokens[0];
  const biased = await client.completions.create({
    ...body, logprobs: 0, logit_bias: { [tokenId(banned)]: -100 },
  });
  assert.ok(!biased.choices[0].logprobs.tokens.includes(banned), banned);
  // The greedy first token as a stop token: alone it ends generation at once; min_tokens keeps
  // it out of the first 6 (masked), and generation goes on past them.
  const stopId = tokenId(plain.logprobs.tokens[0]);
  const stops = { ...body, logprobs: 0, max_tokens: 12, stop_token_ids: [stopId] };
  const early = await client.completions.create(stops);
  assert.equal(early.usage.completion_tokens, 1);
  const held = await client.completions.create({ ...stops, min_tokens: 6 });
  assert.ok(!held.choices[0].logprobs.tokens.slice(0, 6).map(tokenId).includes(stopId));
  assert.ok(held.usage.completion_tokens >= 6);
});

// Scoring a text by echoing it (prefill, every row's logits) equals generating it (decode).
test("echo with logprobs: the prompt's log-probabilities equal a decoding pass", async () => {
  const prompt = "The pass key is 7261. The pass key is";
  const body = { model: MODEL_NAME, temperature: 0, eviction_policy: "none" };
  const gen = (await client.completions.create({
    ...body, prompt, max_tokens: 10, logprobs: 2,
  })).choices[0];
  const promptIds = (await (await fetch(`${shared.base}/tokenize`, {
    method: "POST", body: JSON.stringify({ prompt }),
  })).json()).tokens;
  const decoded = gen.logprobs.tokens.map(tokenId);
  for (const max_tokens of [0, 1]) {
    const echo = (await client.completions.create({
      ...body, prompt: [...promptIds, ...decoded], max_tokens, logprobs: 2, echo: true,
    })).choices[0];
    assert.ok(echo.text.startsWith(prompt), echo.text);
    const lp = echo.logprobs;
    const n = promptIds.length + decoded.length;
    assert.equal(lp.tokens.length, n + max_tokens);
    assert.equal(lp.token_logprobs[0], null);
    assert.equal(lp.top_logprobs[0], null);
    assert.deepEqual(lp.text_offset.slice(0, 3), [0, 0, 1]);  // [BOS] has no text
    lp.token_logprobs.slice(promptIds.length, n).forEach((x, i) => {
      assert.ok(Math.abs(x - gen.logprobs.token_logprobs[i]) < 1e-4, `${x} vs decode`);
      assert.deepEqual(Object.keys(lp.top_logprobs[promptIds.length + i]),
        Object.keys(gen.logprobs.top_logprobs[i]));
    });
  }
  // Streamed, the echo comes first.
  const stream = await client.completions.create({
    ...body, prompt, max_tokens: 3, echo: true, stream: true,
  });
  let text = "";
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? "";
  assert.ok(text.startsWith(prompt) && text.length > prompt.length, text);
});

test("allowed_token_ids and bad_words constrain sampling; prompt_logprobs in vLLM's shape",
     async () => {
  const body = { model: MODEL_NAME, prompt: "The grass is", max_tokens: 16, temperature: 1,
                 seed: 3, ignore_eos: true };
  // Only "a" and "b" (byte ids 97, 98) may come out, sampled at temperature 1.
  const allowed = (await client.completions.create({ ...body, allowed_token_ids: [97, 98] }))
    .choices[0].text;
  assert.match(allowed, /^[ab]{16}$/);
  // Greedy text, then the same with its own third word banned: it never appears.
  const greedy = { ...body, temperature: 0, max_tokens: 24 };
  const plain = (await client.completions.create(greedy)).choices[0].text;
  const word = plain.match(/[!-~]{2,}/)?.[0];  // printable ASCII: the test model's text is odd
  assert.ok(word, plain);
  const banned = (await client.completions.create({ ...greedy, bad_words: [word] }))
    .choices[0].text;
  assert.ok(!banned.includes(word), `${word} in ${banned}`);
  assert.notEqual(banned, plain);
  // prompt_logprobs: [null, {id: {logprob, rank, decoded_token}}...], the prompt's own token
  // first, with the requested alternatives; the same numbers as echo's logprobs.
  const scored = await client.completions.create({
    ...greedy, max_tokens: 1, prompt_logprobs: 2, logprobs: 2, echo: true,
  });
  const pl = scored.choices[0].prompt_logprobs;
  const ids = (await (await fetch(`${shared.base}/tokenize`, {
    method: "POST", body: JSON.stringify({ prompt: body.prompt }),
  })).json()).tokens;
  assert.equal(pl.length, ids.length);
  assert.equal(pl[0], null);
  for (let i = 1; i < ids.length; ++i) {
    const own = pl[i][String(ids[i])];
    assert.ok(Math.abs(own.logprob - scored.choices[0].logprobs.token_logprobs[i]) < 1e-6);
    assert.equal(own.decoded_token, body.prompt[i - 1]);
    assert.ok(Object.keys(pl[i]).length >= 2 && Object.keys(pl[i]).length <= 3);
    const ranks = Object.values(pl[i]).map((e) => e.rank);
    assert.ok(ranks.includes(1) && own.rank >= 1, JSON.stringify(pl[i]));
  }
  // Streamed, they come with the first event; beam search is refused by name.
  const stream = await client.completions.create({
    ...greedy, max_tokens: 2, prompt_logprobs: 0, stream: true,
  });
  const firsts = [];
  for await (const chunk of stream) firsts.push(chunk.choices[0]?.prompt_logprobs);
  assert.equal(firsts[0].length, ids.length);
  assert.ok(firsts.slice(1).every((x) => x === undefined));
  const err = await client.completions.create({ ...greedy, use_beam_search: true })
    .then(() => null, (e) => e);
  assert.equal(err.status, 400);
  assert.equal(err.param, "use_beam_search");
});

test("n samples of each prompt: seeded runs reproducible, choices indexed as OpenAI's", async () => {
  const body = { model: MODEL_NAME, prompt: "The sky is", max_tokens: 8, temperature: 1, seed: 7 };
  const three = await client.completions.create({ ...body, n: 3 });
  assert.deepEqual(three.choices.map((c) => c.index), [0, 1, 2]);
  const again = await client.completions.create({ ...body, n: 3 });
  assert.deepEqual(again.choices.map((c) => c.text), three.choices.map((c) => c.text));
  assert.ok(new Set(three.choices.map((c) => c.text)).size > 1, "three equal samples");
  // Choice j samples as a single request seeded seed + j (as vLLM's).
  const third = await client.completions.create({ ...body, seed: 9 });
  assert.equal(third.choices[0].text, three.choices[2].text);
  assert.equal(three.usage.completion_tokens, 24);
  assert.equal(three.usage.prompt_tokens, third.usage.prompt_tokens);  // the prompt counts once

  // Several prompts: n choices each, prompt after prompt; each as its own request would be.
  const prompts = ["The grass is", "The sun is"];
  const batch = await client.completions.create({
    model: MODEL_NAME, prompt: prompts, n: 2, max_tokens: 6, temperature: 0,
  });
  assert.deepEqual(batch.choices.map((c) => c.index), [0, 1, 2, 3]);
  let promptTokens = 0;
  for (const [i, prompt] of prompts.entries()) {
    const one = await client.completions.create({
      model: MODEL_NAME, prompt, max_tokens: 6, temperature: 0,
    });
    assert.equal(batch.choices[2 * i].text, one.choices[0].text);
    assert.equal(batch.choices[2 * i + 1].text, one.choices[0].text);
    promptTokens += one.usage.prompt_tokens;
  }
  assert.equal(batch.usage.prompt_tokens, promptTokens);

  // Streamed: every chunk names its choice; each choice's text is the plain one's.
  const stream = await client.completions.create({ ...body, n: 3, stream: true });
  const texts = ["", "", ""], reasons = [];
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      texts[c.index] += c.text;
      if (c.finish_reason) reasons.push(c.index);
    }
  }
  assert.deepEqual(texts, three.choices.map((c) => c.text));
  assert.deepEqual(reasons.sort(), [0, 1, 2]);
});

test("/tokenize and /detokenize answer as vLLM's", async () => {
  const post = async (path, body) => {
    const r = await fetch(`${shared.base}${path}`, {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
    });
    return { status: r.status, json: await r.json() };
  };
  const t = await post("/tokenize", { model: MODEL_NAME, prompt: "héllo" });
  assert.equal(t.status, 200);
  const ids = [256, ...Buffer.from("héllo")]; // [BOS] + bytes
  assert.deepEqual(t.json, { count: ids.length, max_model_len: t.json.max_model_len,
                             tokens: ids, token_strs: null });
  assert.ok(t.json.max_model_len > 0);
  const bare = await post("/tokenize", { prompt: "héllo", add_special_tokens: false });
  assert.deepEqual(bare.json.tokens, ids.slice(1));
  const chat = await post("/tokenize", { messages: [{ role: "user", content: "hi" }] });
  assert.deepEqual(chat.json.tokens,
                   [256, ...Buffer.from("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")]);
  const d = await post("/detokenize", { model: MODEL_NAME, tokens: ids });
  assert.deepEqual(d, { status: 200, json: { prompt: "héllo" } });
  const bad = await post("/detokenize", { tokens: [1, 1 << 20] });
  assert.equal(bad.status, 400);
  assert.equal(bad.json.error.param, "tokens");
});

test("the FPA extension fields choose the cache policy; usage reports what it held", async () => {
  const run = (extra) => client.completions.create({
    model: MODEL_NAME, prompt: LONG_PROMPT, max_tokens: 20, temperature: 0, ...extra,
  });
  const none = await run({ eviction_policy: "none" });
  const window = await run({ eviction_policy: "window", cache_budget_fraction: 0.25 });
  const fpa = await run({ eviction_policy: "fpa", tau: 20 });
  const sinks = await run({ eviction_policy: "sinks", cache_budget_fraction: 0.5, sink_tokens: 4 });
  assert.equal(none.usage.live_fraction, 1);
  assert.ok(window.usage.live_fraction <= 0.3, `${window.usage.live_fraction}`);
  assert.ok(sinks.usage.live_fraction <= 0.55, `${sinks.usage.live_fraction}`);
  assert.ok(fpa.usage.live_fraction < 1, `${fpa.usage.live_fraction}`);
  assert.ok(window.usage.cache_bytes_held < none.usage.cache_bytes_held);
});

test("a bad field is a 400 whose error names it", async () => {
  const cases = [
    [{ temperature: -1 }, "temperature"],
    [{ max_tokens: 0 }, "max_tokens"],
    [{ top_p: 2 }, "top_p"],
    [{ eviction_policy: "lru" }, "eviction_policy"],
    [{ tau: 0 }, "tau"],
    [{ cache_budget_fraction: 1.5 }, "cache_budget_fraction"],
    [{ prompt: "" }, "prompt"],
    [{ prompt: [256, 999999] }, "prompt"],
    [{ n: 0 }, "n"],
    [{ prompt: ["x", [1, "y"]] }, "prompt"],
    [{ logprobs: 21 }, "logprobs"],
    [{ repetition_penalty: 0 }, "repetition_penalty"],
    [{ presence_penalty: 2.5 }, "presence_penalty"],
    [{ frequency_penalty: -3 }, "frequency_penalty"],
    [{ min_p: 1.5 }, "min_p"],
    [{ min_tokens: 4 }, "min_tokens"],  // more than max_tokens
    [{ logit_bias: { 999999: 1 } }, "logit_bias"],
    [{ logit_bias: { 65: 101 } }, "logit_bias"],
    [{ logit_bias: { x: 1 } }, "logit_bias"],
    [{ stop_token_ids: "2" }, "stop_token_ids"],
    [{ allowed_token_ids: [999999] }, "allowed_token_ids"],
    [{ bad_words: [7] }, "bad_words"],
    [{ prompt_logprobs: 21 }, "prompt_logprobs"],
    [{ length_penalty: 0.5 }, "length_penalty"],
  ];
  for (const [extra, field] of cases) {
    const err = await client.completions
      .create({ model: MODEL_NAME, prompt: "x", max_tokens: 2, ...extra })
      .then(() => null, (e) => e);
    assert.ok(err instanceof OpenAI.BadRequestError, `${field}: ${err}`);
    assert.equal(err.status, 400);
    assert.equal(err.param, field);
    assert.equal(err.type, "invalid_request_error");
    assert.ok(err.message.includes(`${field}: `), err.message);
  }
  const wrongModel = await client.completions
    .create({ model: "gpt-4", prompt: "x" }).then(() => null, (e) => e);
  assert.ok(wrongModel instanceof OpenAI.NotFoundError);
});

test("unknown fields are accepted and ignored, named in a response header, as vLLM does",
     async () => {
  const body = { model: MODEL_NAME, prompt: "x", max_tokens: 2, temperature: 0 };
  const { data, response } = await client.completions
    .create({ ...body, tempreature: 1, guided_json: { type: "object" } })
    .withResponse();
  assert.equal(data.choices[0].finish_reason, "length");
  assert.equal(response.headers.get("x-fpa-ignored-fields"), "guided_json, tempreature"); // in name order
  const plain = await client.completions.create(body).withResponse();
  assert.equal(plain.response.headers.get("x-fpa-ignored-fields"), null);
  assert.equal(plain.data.choices[0].text, data.choices[0].text);
  // Streamed too, and a header cannot be forged with a field name.
  const raw = await fetch(`${shared.base}/v1/completions`, {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ ...body, stream: true, "a\r\nSet-Cookie: x": 1,
                           stream_options: { continuous_usage_stats: true } }),
  });
  assert.equal(raw.status, 200);
  assert.equal(raw.headers.get("set-cookie"), null);
  assert.equal(raw.headers.get("x-fpa-ignored-fields"),
               "a??Set-Cookie: x, stream_options.continuous_usage_stats");
  await raw.text();
  assert.match(shared.log(), /present in the request but ignored: guided_json, tempreature/);
});

test("the body of vLLM's benchmark client (vllm bench serve, openai completions) is served",
     async () => {
  // vLLM's async_request_openai_completions (module vllm.benchmarks.lib.endpoint_request_func)
  // at vllm-project/vllm@3aee4a4f4c4d1a2a7af3ebdb88c768e459e6c602, with --ignore-eos; "logprobs"
  // is None unless --logprobs is given, which aiohttp sends as null.
  const payload = {
    model: MODEL_NAME, prompt: "The sky is blue. The grass is", repetition_penalty: 1.0,
    max_tokens: 10, logprobs: null, stream: true, stream_options: { include_usage: true },
    ignore_eos: true,
  };
  const raw = await fetch(`${shared.base}/v1/completions`, {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify(payload),
  });
  assert.equal(raw.status, 200);
  assert.equal(raw.headers.get("x-fpa-ignored-fields"), null);
  const events = (await raw.text()).split("\n\n").filter(Boolean);
  assert.equal(events.at(-1), "data: [DONE]");
  const usage = JSON.parse(events.at(-2).slice("data: ".length)).usage;
  assert.equal(usage.completion_tokens, 10);
});

test("--api-key: a Bearer key is required on the API, not on /health and /metrics", async () => {
  const s = await server("--api-key", "s3cret");
  const ok = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: "s3cret", maxRetries: 0 });
  const r = await ok.completions.create({ model: MODEL_NAME, prompt: "x", max_tokens: 2 });
  assert.equal(r.choices.length, 1);
  const wrong = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: "s3creT", maxRetries: 0 });
  const err = await wrong.completions.create({ model: MODEL_NAME, prompt: "x", max_tokens: 2 })
    .then(() => null, (e) => e);
  assert.ok(err instanceof OpenAI.AuthenticationError, `${err}`);
  assert.equal(err.status, 401);
  assert.equal((await fetch(`${s.base}/v1/models`)).status, 401);
  assert.equal((await fetch(`${s.base}/health`)).status, 200);
  assert.equal((await fetch(`${s.base}/metrics`)).status, 200);
  s.stop();
});

test("--http-max-connections caps the API's open connections", async () => {
  const s = await server("--http-max-connections", "2");
  const port = Number(new URL(s.base).port);
  const open = () => new Promise((resolve) => {
    const sock = net.connect(port, "127.0.0.1", () => resolve(sock));
  });
  const held = [await open(), await open()];
  const third = await open();
  const answer = await new Promise((resolve) => {
    let data = "";
    third.on("data", (d) => { data += d; });
    third.on("close", () => resolve(data));
    third.write("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  });
  assert.match(answer, /^HTTP\/1\.1 503/);
  held.forEach((c) => c.destroy());
  s.stop();
});

// What a failure shows of a server's cache and queue.
function cacheFigures(m) {
  return Object.entries(m).filter(([k]) => /^fpa_(cache|requests_(running|waiting)|prefix)/.test(k))
    .map(([k, v]) => `${k}=${v}`).join(" ");
}

// A streamed request that runs until it is stopped.
const LONG_STREAM = {
  model: MODEL_NAME, prompt: "The sky is blue. ".repeat(40), max_tokens: 100000, ignore_eos: true,
  stream: true,
};

// Streams a long request until its first token; returns the stream's iterator.
async function longStream(c) {
  const stream = await c.completions.create(LONG_STREAM);
  const it = stream[Symbol.asyncIterator]();
  await it.next();
  return it;
}

test("a full queue is a 429; a draining server is a 503 and ends what it could not finish", async () => {
  const s = await server("--max-batch", "1", "--max-queue", "1", "--drain-seconds", "2");
  const c = clientOf(s);
  const running = await longStream(c);
  const queued = fetch(`${s.base}/v1/completions`, {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt: "queued", max_tokens: 100000, ignore_eos: true }),
  });
  assert.ok(await eventually(async () => (await s.metrics())["fpa_requests_waiting"] === 1));
  const err = await c.completions.create({ model: MODEL_NAME, prompt: "x", max_tokens: 2 })
    .then(() => null, (e) => e);
  assert.ok(err instanceof OpenAI.RateLimitError, `${err}`);
  assert.equal(err.status, 429);
  assert.equal(err.type, "rate_limit_error");
  assert.equal(err.headers.get("retry-after"), "1");
  s.proc.kill("SIGTERM");
  assert.ok(await eventually(async () => (await fetch(`${s.base}/health`)).status === 503));
  const refused = await c.completions.create({ model: MODEL_NAME, prompt: "x", max_tokens: 2 })
    .then(() => null, (e) => e);
  assert.equal(refused?.status, 503);
  // After the 2 s drain: the stream ends with an error event (the client throws it) and the
  // queued request is answered 503, both before the server exits.
  let streamError = null;
  try {
    while (!(await running.next()).done);
  } catch (e) {
    streamError = e;
  }
  assert.ok(streamError instanceof OpenAI.APIError, `${streamError}`);
  assert.match(streamError.message, /shut down before the request finished/);
  const answer = await queued;
  assert.equal(answer.status, 503);
  assert.equal((await answer.json()).error.code, "unavailable");
});

// Sends a streamed completion over a socket of its own; resolves with the socket once the first
// event arrived.
function rawStream(s, body) {
  const json = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const sock = net.connect(Number(new URL(s.base).port), "127.0.0.1", () => {
      sock.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
                 `Content-Length: ${Buffer.byteLength(json)}\r\n\r\n${json}`);
    });
    sock.setEncoding("utf8");
    sock.on("data", (d) => d.includes("data: ") && resolve(sock));
    sock.on("error", reject);
  });
}

// The client closes its socket. Not the client library's AbortController: Node 18's fetch
// (Debian 12's undici) sometimes leaves an aborted stream's socket open, unread (seen: 550 KB in
// its receive queue, the server's writes stalled), and a server cannot tell that from a slow
// reader until its write timeout.
test("a client that disconnects mid-stream cancels its request and frees its pages", async () => {
  const before = await shared.metrics();
  const cancelledBefore = before['fpa_requests_total{code="CANCELLED"}'] ?? 0;
  const sock = await rawStream(shared, LONG_STREAM);
  const during = await shared.metrics();
  assert.ok(during["fpa_cache_pages_in_use"] > 0);
  assert.equal(during["fpa_requests_running"], 1);
  sock.destroy();
  let seen = {};
  assert.ok(await eventually(async () => {
    seen = await shared.metrics();
    return seen["fpa_cache_pages_in_use"] === 0 && seen["fpa_requests_running"] === 0;
  }, 5000), `pages still held after the client left: ${cacheFigures(seen)}`);
  const m = await shared.metrics();
  assert.equal(m['fpa_requests_total{code="CANCELLED"}'], cancelledBefore + 1);
  assert.equal(m["fpa_cache_live_keys"], 0);
});
