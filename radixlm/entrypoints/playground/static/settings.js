// The settings form: sampling parameters, output format, persistence, and the
// chat request they make (buildRequest). A value out of range or a format that
// cannot be sent raises InputError naming its field; nothing is sent then.

import { parseSchema } from "./schema.js";

const $ = (id) => document.getElementById(id);

const EXAMPLE_SCHEMA = {
  type: "object",
  properties: {
    name: { type: "string" },
    age: { type: "integer", minimum: 0, maximum: 150 },
    hobbies: { type: "array", items: { type: "string" }, maxItems: 3 },
  },
  required: ["name", "age"],
};
const EXAMPLE_EBNF = 'root ::= answer " because " reason\nanswer ::= "yes" | "no"\nreason ::= [a-z ]+ "."';
export const SETTINGS = ["system", "temperature", "top_p", "top_k", "max_tokens", "seed",
  "stop-strings", "format", "format-schema", "format-regex", "format-ebnf"];
const SETTINGS_STORAGE = "radixlm.settings";
export const JSON_MODES = new Set(["json_object", "json_schema"]);
const FORMAT_NAMES = { json_object: "JSON object", json_schema: "JSON schema", regex: "regex",
  ebnf: "EBNF" };

export class InputError extends Error {
  constructor(message, field) {
    super(message);
    this.field = field;
  }
}

export function loadSettings() {
  let saved = {};
  try {
    saved = JSON.parse(localStorage.getItem(SETTINGS_STORAGE) || "{}");
  } catch {
    saved = {};
  }
  for (const id of SETTINGS) {
    if (typeof saved[id] === "string") $(id).value = saved[id];
  }
}

export function saveSettings() {
  const values = Object.fromEntries(SETTINGS.map((id) => [id, $(id).value]));
  try {
    localStorage.setItem(SETTINGS_STORAGE, JSON.stringify(values));
  } catch {
    // storage disabled: settings last for this page
  }
}

function readNumber(id, { integer = false, min = -Infinity, max = Infinity, above = null,
  optional = false, label }) {
  const input = $(id);
  const raw = input.value.trim();
  if (raw === "") {
    if (optional) return null;
    throw new InputError(`${label} is required`, input);
  }
  const value = Number(raw);
  if (!Number.isFinite(value) || (integer && !Number.isInteger(value))) {
    throw new InputError(`${label} must be ${integer ? "an integer" : "a number"}`, input);
  }
  if (value < min || value > max || (above !== null && value <= above)) {
    const lo = above !== null ? `> ${above}` : `≥ ${min}`;
    throw new InputError(`${label} must be ${lo}${max < Infinity ? ` and ≤ ${max}` : ""}`, input);
  }
  return value;
}

// The request fields of the chosen output format (throws InputError).
function formatFields() {
  const mode = $("format").value;
  if (mode === "json_object") return { response_format: { type: "json_object" } };
  if (mode === "json_schema") {
    let schema;
    try {
      schema = parseSchema($("format-schema").value);
    } catch (e) {
      throw new InputError(e.message, $("format-schema"));
    }
    return { response_format: { type: "json_schema",
      json_schema: { name: "playground", schema } } };
  }
  if (mode === "regex") {
    const regex = $("format-regex").value;
    if (!regex) throw new InputError("The regex is empty", $("format-regex"));
    return { regex };
  }
  if (mode === "ebnf") {
    const ebnf = $("format-ebnf").value;
    if (!ebnf.trim()) throw new InputError("The EBNF grammar is empty", $("format-ebnf"));
    return { ebnf };
  }
  return {};
}

function apiMessages(history) {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of history) {
    if (m.images && m.images.length) {
      const parts = m.content ? [{ type: "text", text: m.content }] : [];
      for (const url of m.images) parts.push({ type: "image_url", image_url: { url } });
      messages.push({ role: m.role, content: parts });
    } else {
      messages.push({ role: m.role, content: m.content });
    }
  }
  return messages;
}

export function buildRequest(history, model) {
  const body = {
    messages: apiMessages(history),
    stream: true,
    stream_options: { include_usage: true, continuous_usage_stats: true },
    temperature: readNumber("temperature", { min: 0, max: 100, label: "Temperature" }),
    top_p: readNumber("top_p", { above: 0, max: 1, label: "top_p" }),
    ...formatFields(),
  };
  // Empty: up to the end of the context.
  const maxTokens = readNumber("max_tokens", { integer: true, min: 1, optional: true,
    label: "Max tokens" });
  if (maxTokens !== null) body.max_tokens = maxTokens;
  if (model) body.model = model;
  const topK = readNumber("top_k", { integer: true, min: -1, optional: true, label: "top_k" });
  if (topK !== null) body.top_k = topK;
  const seed = readNumber("seed", { integer: true, min: 0, max: 2 ** 63 - 1, optional: true,
    label: "Seed" });
  if (seed !== null) body.seed = seed;
  const stops = $("stop-strings").value.split("\n").filter((s) => s !== "");
  if (stops.length) body.stop = stops;
  return body;
}

export function showFormatFields() {
  const mode = $("format").value;
  $("format-schema-field").hidden = mode !== "json_schema";
  $("format-regex-field").hidden = mode !== "regex";
  $("format-ebnf-field").hidden = mode !== "ebnf";
  if (mode === "json_schema" && !$("format-schema").value.trim()) {
    $("format-schema").value = JSON.stringify(EXAMPLE_SCHEMA, null, 2);
  }
  if (mode === "ebnf" && !$("format-ebnf").value.trim()) $("format-ebnf").value = EXAMPLE_EBNF;
  $("format-badge").textContent = FORMAT_NAMES[mode] ? `output: ${FORMAT_NAMES[mode]}` : "";
  checkFormat();
}

// Live check of the format fields: the message under them, the field marked.
export function checkFormat() {
  const error = $("format-error");
  for (const id of ["format-schema", "format-regex", "format-ebnf"]) $(id).removeAttribute("aria-invalid");
  try {
    formatFields();
    error.hidden = true;
    error.textContent = "";
    return true;
  } catch (e) {
    if (!(e instanceof InputError)) throw e;
    error.hidden = false;
    error.textContent = e.message;
    e.field?.setAttribute("aria-invalid", "true");
    return false;
  }
}
