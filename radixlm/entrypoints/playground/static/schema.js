// Checks a JSON schema typed into the page before it is sent.
//
// parseSchema(text) returns the schema object or throws an Error whose message
// names the place (a JSON pointer) and the problem. It catches what a person
// gets wrong by hand: JSON syntax, misspelt types, keywords with values of the
// wrong kind, bad regex patterns, dangling $refs. What the grammar compiler
// alone can judge (unsupported keywords, say) comes back as the server's 400.

const TYPES = new Set(["string", "number", "integer", "boolean", "object", "array", "null"]);
const SCHEMA_KEYS = ["additionalProperties", "additionalItems", "items", "not", "contains",
  "propertyNames", "if", "then", "else", "unevaluatedProperties", "unevaluatedItems"];
const SCHEMA_MAPS = ["properties", "patternProperties", "$defs", "definitions",
  "dependentSchemas"];
const SCHEMA_LISTS = ["anyOf", "oneOf", "allOf", "prefixItems"];
const COUNTS = ["minLength", "maxLength", "minItems", "maxItems", "minProperties",
  "maxProperties", "minContains", "maxContains"];
const NUMBERS = ["minimum", "maximum", "multipleOf"];

class SchemaError extends Error {}

function fail(path, message) {
  throw new SchemaError(`${path || "/"}: ${message}`);
}

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function escapePointer(key) {
  return key.replace(/~/g, "~0").replace(/\//g, "~1");
}

function resolvePointer(root, ref) {
  let node = root;
  for (const part of ref.slice(2).split("/").filter((p) => p !== "")) {
    const key = decodeURIComponent(part).replace(/~1/g, "/").replace(/~0/g, "~");
    if (node === null || typeof node !== "object" || !(key in node)) return undefined;
    node = node[key];
  }
  return node;
}

function checkCounts(node, path) {
  for (const key of COUNTS) {
    if (key in node && !(Number.isInteger(node[key]) && node[key] >= 0)) {
      fail(`${path}/${key}`, "must be a non-negative integer");
    }
  }
  for (const [lo, hi] of [["minLength", "maxLength"], ["minItems", "maxItems"],
    ["minProperties", "maxProperties"], ["minimum", "maximum"]]) {
    if (typeof node[lo] === "number" && typeof node[hi] === "number" && node[lo] > node[hi]) {
      fail(path, `${lo} (${node[lo]}) is larger than ${hi} (${node[hi]})`);
    }
  }
  for (const key of NUMBERS) {
    if (key in node && typeof node[key] !== "number") fail(`${path}/${key}`, "must be a number");
  }
  if ("multipleOf" in node && !(node.multipleOf > 0)) fail(`${path}/multipleOf`, "must be > 0");
  for (const key of ["exclusiveMinimum", "exclusiveMaximum"]) {
    if (key in node && !["number", "boolean"].includes(typeof node[key])) {
      fail(`${path}/${key}`, "must be a number");
    }
  }
}

function checkType(node, path) {
  if (!("type" in node)) return;
  const types = Array.isArray(node.type) ? node.type : [node.type];
  if (types.length === 0) fail(`${path}/type`, "must not be an empty list");
  for (const t of types) {
    if (typeof t !== "string" || !TYPES.has(t)) {
      fail(`${path}/type`, `${JSON.stringify(t)} is not a JSON schema type (one of ${[...TYPES].join(", ")})`);
    }
  }
}

function checkNode(node, path, root) {
  if (typeof node === "boolean") return;
  if (!isObject(node)) fail(path, "a schema must be an object (or true / false)");
  checkType(node, path);
  checkCounts(node, path);
  if ("required" in node) {
    const req = node.required;
    if (!Array.isArray(req) || !req.every((r) => typeof r === "string")) {
      fail(`${path}/required`, "must be a list of property names");
    }
    if (new Set(req).size !== req.length) fail(`${path}/required`, "lists a name twice");
  }
  if ("enum" in node && (!Array.isArray(node.enum) || node.enum.length === 0)) {
    fail(`${path}/enum`, "must be a non-empty list");
  }
  if ("pattern" in node) {
    if (typeof node.pattern !== "string") fail(`${path}/pattern`, "must be a string");
    try {
      new RegExp(node.pattern, "u");
    } catch (e) {
      fail(`${path}/pattern`, `not a valid regex: ${e.message}`);
    }
  }
  if ("$ref" in node) {
    if (typeof node.$ref !== "string") fail(`${path}/$ref`, "must be a string");
    if (node.$ref.startsWith("#") && resolvePointer(root, node.$ref) === undefined) {
      fail(`${path}/$ref`, `${node.$ref} points at nothing in this schema`);
    }
  }
  for (const key of SCHEMA_KEYS) {
    if (!(key in node)) continue;
    if (key === "items" && Array.isArray(node.items)) {
      node.items.forEach((s, i) => checkNode(s, `${path}/items/${i}`, root));
    } else {
      checkNode(node[key], `${path}/${key}`, root);
    }
  }
  for (const key of SCHEMA_MAPS) {
    if (!(key in node)) continue;
    if (!isObject(node[key])) fail(`${path}/${key}`, "must be an object of schemas");
    for (const [name, sub] of Object.entries(node[key])) {
      checkNode(sub, `${path}/${key}/${escapePointer(name)}`, root);
    }
  }
  for (const key of SCHEMA_LISTS) {
    if (!(key in node)) continue;
    if (!Array.isArray(node[key]) || node[key].length === 0) {
      fail(`${path}/${key}`, "must be a non-empty list of schemas");
    }
    node[key].forEach((s, i) => checkNode(s, `${path}/${key}/${i}`, root));
  }
}

export function parseSchema(text) {
  if (!text.trim()) throw new SchemaError("The JSON schema is empty");
  let schema;
  try {
    schema = JSON.parse(text);
  } catch (e) {
    throw new SchemaError(`The JSON schema is not valid JSON: ${e.message}`);
  }
  checkNode(schema, "", schema);
  return schema;
}
