// A small Markdown renderer that builds DOM nodes and never parses HTML.
//
// Model output is untrusted: every piece of it enters the page through
// createTextNode / textContent, so `<script>` or `<img onerror=...>` in an
// answer shows as those characters. Links keep only http(s) and mailto URLs.
// Supported: headings, paragraphs (a newline is a line break), fenced code
// blocks (verbatim, even while still open during streaming), block quotes,
// ordered and unordered lists, pipe tables, rules, and inline code, bold,
// italic, strike-through and links.

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}>\s?/;
const BULLET = /^(\s*)([-*+])\s+(.*)$/;
const NUMBERED = /^(\s*)(\d{1,9})[.)]\s+(.*)$/;
const TABLE_SEP = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

function el(tag, className) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
}

// Inline spans, earliest match first; code spans are verbatim.
const INLINE = [
  { re: /(`+)([\s\S]*?[^`])\1(?!`)/, make: (m) => textEl("code", m[2]) },
  { re: /\[([^\]\n]+)\]\(([^)\s]+)\)/, make: (m) => link(m[1], m[2]) },
  { re: /\*\*(?=\S)([\s\S]*?\S)\*\*/, make: (m) => spanEl("strong", m[1]) },
  { re: /(?<![\w])__(?=\S)([\s\S]*?\S)__(?![\w])/, make: (m) => spanEl("strong", m[1]) },
  { re: /~~(?=\S)([\s\S]*?\S)~~/, make: (m) => spanEl("del", m[1]) },
  { re: /\*(?=[^\s*])([^*]*?[^\s*])\*/, make: (m) => spanEl("em", m[1]) },
  { re: /(?<![\w])_(?=[^\s_])([^_]*?[^\s_])_(?![\w])/, make: (m) => spanEl("em", m[1]) },
];

function textEl(tag, text) {
  const node = el(tag);
  node.textContent = text;
  return node;
}

function spanEl(tag, text) {
  const node = el(tag);
  renderInline(text, node);
  return node;
}

function link(label, url) {
  if (!/^(https?:\/\/|mailto:)/i.test(url)) return document.createTextNode(`[${label}](${url})`);
  const a = el("a");
  a.href = url;
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  renderInline(label, a);
  return a;
}

export function renderInline(text, parent) {
  let rest = text;
  while (rest) {
    let best = null;
    for (const rule of INLINE) {
      const m = rule.re.exec(rest);
      if (m && (best === null || m.index < best.m.index)) best = { m, rule };
    }
    if (best === null) {
      parent.append(document.createTextNode(rest));
      return;
    }
    if (best.m.index > 0) parent.append(document.createTextNode(rest.slice(0, best.m.index)));
    parent.append(best.rule.make(best.m));
    rest = rest.slice(best.m.index + best.m[0].length);
  }
}

// Inline text with its newlines as <br>.
function renderLines(lines, parent) {
  lines.forEach((line, i) => {
    if (i > 0) parent.append(el("br"));
    renderInline(line, parent);
  });
}

function codeBlock(lines, lang) {
  const wrap = el("div", "code-block");
  const bar = el("div", "code-bar");
  bar.append(textEl("span", lang || "text"));
  const copy = textEl("button", "copy");
  copy.type = "button";
  copy.className = "copy-code";
  const text = lines.join("\n");
  copy.addEventListener("click", () => {
    navigator.clipboard?.writeText(text).then(() => {
      copy.textContent = "copied";
      setTimeout(() => { copy.textContent = "copy"; }, 1200);
    }, () => {});
  });
  bar.append(copy);
  const pre = el("pre");
  pre.append(textEl("code", text));
  wrap.append(bar, pre);
  return wrap;
}

function splitRow(line) {
  let row = line.trim();
  if (row.startsWith("|")) row = row.slice(1);
  if (row.endsWith("|") && !row.endsWith("\\|")) row = row.slice(0, -1);
  return row.split(/(?<!\\)\|/).map((cell) => cell.trim().replace(/\\\|/g, "|"));
}

function table(header, rows) {
  const wrap = el("div", "table-wrap");
  const t = el("table");
  const head = el("tr");
  for (const cell of splitRow(header)) {
    const th = el("th");
    renderInline(cell, th);
    head.append(th);
  }
  t.append(el("thead"));
  t.firstChild.append(head);
  const body = el("tbody");
  for (const line of rows) {
    const tr = el("tr");
    for (const cell of splitRow(line)) {
      const td = el("td");
      renderInline(cell, td);
      tr.append(td);
    }
    body.append(tr);
  }
  t.append(body);
  wrap.append(t);
  return wrap;
}

// One list starting at lines[i]; items continue on indented lines.
function list(lines, i, parent) {
  const first = BULLET.exec(lines[i]) || NUMBERED.exec(lines[i]);
  const ordered = !BULLET.test(lines[i]);
  const node = el(ordered ? "ol" : "ul");
  if (ordered && first[2] !== "1") node.start = Number(first[2]);
  const indent = first[1].length;
  let item = null;
  let itemLines = [];
  const flush = () => {
    if (item) renderBlocks(itemLines, item, true);
  };
  while (i < lines.length) {
    const line = lines[i];
    const m = ordered ? NUMBERED.exec(line) : BULLET.exec(line);
    if (m && m[1].length <= indent + 1) {
      flush();
      item = el("li");
      node.append(item);
      itemLines = [m[3]];
    } else if (line.trim() === "" && i + 1 < lines.length && /^\s+\S/.test(lines[i + 1])) {
      itemLines.push("");
    } else if (/^\s+\S/.test(line) && item) {
      itemLines.push(line.replace(/^\s{1,4}/, ""));
    } else {
      break;
    }
    i += 1;
  }
  flush();
  parent.append(node);
  return i;
}

function isBlockStart(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line)
    || BULLET.test(line) || NUMBERED.test(line);
}

// Block structure of `lines` into `parent`; `tight` (inside a list item) skips <p>.
function renderBlocks(lines, parent, tight = false) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (line.trim() === "") {
      i += 1;
    } else if ((m = FENCE.exec(line))) {
      const fence = m[1];
      const body = [];
      i += 1;
      while (i < lines.length && !lines[i].trim().startsWith(fence)) body.push(lines[i++]);
      i += 1; // the closing fence (absent while the answer is still streaming)
      parent.append(codeBlock(body, m[2]));
    } else if ((m = HEADING.exec(line))) {
      const h = el(`h${m[1].length}`);
      renderInline(m[2], h);
      parent.append(h);
      i += 1;
    } else if (RULE.test(line)) {
      parent.append(el("hr"));
      i += 1;
    } else if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && QUOTE.test(lines[i])) body.push(lines[i++].replace(QUOTE, ""));
      const quote = el("blockquote");
      renderBlocks(body, quote);
      parent.append(quote);
    } else if (BULLET.test(line) || NUMBERED.test(line)) {
      i = list(lines, i, parent);
    } else if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1])
               && lines[i + 1].includes("-")) {
      const rows = [];
      let j = i + 2;
      while (j < lines.length && lines[j].includes("|") && lines[j].trim()) rows.push(lines[j++]);
      parent.append(table(line, rows));
      i = j;
    } else {
      const para = [];
      while (i < lines.length && lines[i].trim() !== "" && (para.length === 0
             || !isBlockStart(lines[i]))) para.push(lines[i++]);
      if (tight) {
        renderLines(para, parent);
      } else {
        const p = el("p");
        renderLines(para, p);
        parent.append(p);
      }
    }
  }
}

// Render `text` as Markdown into `parent` (its old content is replaced).
export function renderMarkdown(text, parent) {
  parent.replaceChildren();
  renderBlocks(text.replace(/\r\n?/g, "\n").split("\n"), parent);
}

// Render `text` verbatim (for JSON and other structured output).
export function renderVerbatim(text, parent, lang) {
  parent.replaceChildren(codeBlock(text.split("\n"), lang));
}
