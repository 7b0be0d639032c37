// Chat template parity (issue 24): model/jinja (through render_template_cli) against Hugging
// Face's @huggingface/jinja, an independent implementation, on the 53 published templates of
// tests/vectors/chat_templates/hf_jinja_e2e.json with hostile chats: quotes, Jinja delimiters
// in content, newlines and whitespace runs, mixed scripts and emoji, empty content, many turns,
// tool calls. Each rendering must be equal, or both must fail.
//   node jinja_parity.mjs PATH/TO/render_template_cli
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";

const cli = process.argv[2];
const cases = JSON.parse(readFileSync(
    new URL("../vectors/chat_templates/hf_jinja_e2e.json", import.meta.url), "utf8"));

// strftime_now reads the clock: both sides see 2025-07-10T12:00:00Z.
const FIXED = Date.UTC(2025, 6, 10, 12);
const RealDate = Date;
globalThis.Date = class extends RealDate {
  constructor(...args) { super(...(args.length ? args : [FIXED])); }
  static now() { return FIXED; }
};

// Where the two differ, by template: the chats ("*": all) and why. Each was checked against
// Python's jinja2 3.1.6 with transformers' settings, which renders (or fails) as fpa-serve does:
// the differences are @huggingface/jinja's.
const KNOWN_DIFFERENCES = {
  "MadeAgents/Hammer2.1": ["*", "js: `tools|string` prints JSON, Python the list's repr"],
  "meetkai/functionary-medium-v2.2": [["tool_calls"], "js: str + dict concatenates, Python fails"],
  "deepseek-ai/DeepSeek-R1": [["tool_calls"], "js: str + dict concatenates, Python fails"],
  "CohereForAI/c4ai-command-r-v01": ["*", "js: a for loop over undefined fails"],
  "CohereForAI/c4ai-command-r-v01 (JSON Schema)": ["*", "js: a for loop over undefined fails"],
  "NousResearch/Hermes-2-Pro-Llama-3-8B (JSON Schema)":
      ["*", "js: a for loop over undefined fails; trim of undefined fails"],
  "CISCai/Mistral-7B-Instruct-v0.3-SOTA-GGUF": [["tool_calls"], "js: a str method is missing"],
  "meta-llama/Llama-3.2-11B-Vision-Instruct": ["*", "js: a for loop over a string fails"],
  "meta-llama/Llama-Guard-3-11B-Vision": ["*", "js: selectattr on a string fails"],
  "HuggingFaceTB/SmolLM3-3B": [["whitespace", "tool_calls"],
                               "js: str methods on U+2028 and NBSP; |string of a dict fails"],
  "CohereLabs/command-a-reasoning-08-2025": [["empty"],
                                             "js: an attribute of undefined renders, Python fails"],
};

const known = (template, chat) => {
  const entry = KNOWN_DIFFERENCES[template];
  return entry !== undefined && (entry[0] === "*" || entry[0].includes(chat));
};

const user = (content) => ({ role: "user", content });
const assistant = (content) => ({ role: "assistant", content });
const TOOLS = [{ type: "function", function: {
  name: "get_weather", description: "Weather \"now\" at {{ city }}",
  parameters: { type: "object", properties: { city: { type: "string", description: "A city" },
                days: { type: "integer", enum: [1, 2] } }, required: ["city"] } } }];

const CHATS = {
  quotes_and_delimiters: [
    { role: "system", content: "Say \"hi\" and 'bye'. {{ bos_token }} {% if x %} {# no #} %}" },
    user("{{ raise_exception('x') }} {%- endfor %} \\n \\\" }}"),
    assistant("'\"'\"{{\"}}'"),
    user("{% raw %}{{ x }}{% endraw %}")],
  whitespace: [user("\n\n  leading and trailing  \n\t"), assistant(" \r\n x \r\n "),
               user("a\u2028b\u00a0c   \t\t\n")],
  unicode: [user("h\u00e9llo \u4e2d\u6587 \u0440\u0443\u0441 \ud83d\ude00 \u200b\u00ad"),
            assistant("\u00e9" + "\ud83d\ude00".repeat(5)), user("\u0130stanbul \u00df \ufb01")],
  empty: [user(""), assistant(""), user("")],
  many_turns: Array.from({ length: 40 }, (_, i) =>
    (i % 2 ? assistant : user)(`turn ${i} ${"x".repeat(i)}`)),
  tool_calls: [
    { role: "system", content: "Use tools." }, user("Weather in Paris?"),
    { role: "assistant", content: "", tool_calls: [{ type: "function", id: "call_1",
      function: { name: "get_weather", arguments: { city: "Paris \"FR\"", days: 2 } } }] },
    { role: "tool", name: "get_weather", tool_call_id: "call_1",
      content: "{\"temp\": 21.5, \"note\": \"{{ not a tag }}\"}" },
    assistant("21.5 \u00b0C")],
};

function contexts(data) {
  return Object.entries(CHATS).map(([name, messages]) => ({
    name,
    context: { messages, add_generation_prompt: true, bos_token: "<s>", eos_token: "</s>",
               ...(name === "tool_calls" ? { tools: TOOLS } : {}) },
  })).concat([{ name: "published", context: data }]);
}

function jsRender(source, context) {
  try {
    return { text: new Template(source).render(structuredClone(context)) };
  } catch (e) {
    return { error: String(e.message ?? e) };
  }
}

let compared = 0, bothFailed = 0, knownDiffering = 0;
const failures = [];
for (const c of cases) {
  const runs = contexts(c.data);
  const ours = JSON.parse(execFileSync(cli, {
    input: JSON.stringify({ template: c.chat_template, contexts: runs.map((r) => r.context) }),
    maxBuffer: 1 << 28 }).toString()).results;
  runs.forEach((run, i) => {
    const js = jsRender(c.chat_template, run.context);
    compared++;
    if (js.error !== undefined && ours[i].error !== undefined) {
      bothFailed++;
    } else if (js.text !== ours[i].text) {
      if (known(c.name, run.name)) {
        knownDiffering++;
        return;
      }
      failures.push({ template: c.name, chat: run.name, ours: ours[i], js });
    }
  });
}
for (const f of failures) {
  console.log(`DIFF ${f.template} / ${f.chat}\n  ours: ${JSON.stringify(f.ours).slice(0, 400)}\n` +
              `  js:   ${JSON.stringify(f.js).slice(0, 400)}`);
}
console.log(`${compared} renderings compared (${bothFailed} failed on both sides), ` +
            `${knownDiffering} differ as documented, ${failures.length} differ unexpectedly`);
process.exit(failures.length ? 1 : 0);
