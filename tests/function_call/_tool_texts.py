"""Model outputs per tool-call format, as the models write them, with what they parse to.

VALID: (parser, text, content, [(name, arguments)]) - the parse, and equally the
joined stream for every cut. MALFORMED: (parser, text) - never a crash, and the
parse is the text as content; the stream is the same unless the call broke after
it began streaming (BROKEN_LATE).
"""

from __future__ import annotations

from radixlm.function_call import ToolSpec

TOOLS = [
    ToolSpec(
        "get_weather",
        {
            "type": "object",
            "properties": {
                "location": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
        "The current weather in a place",
    ),
    ToolSpec("get_time", {"type": "object", "properties": {"timezone": {"type": "string"}}}),
    ToolSpec("search", {"type": "object", "properties": {"query": {"type": "string"}}}),
]

# The arguments written in the texts below, as the model wrote them.
PARIS = '{"location": "Paris, France", "unit": "celsius"}'
NESTED = (
    '{"query": "caf\\u00e9 \\"au lait\\" \\\\ 東京 🍵", "filters": {"tags": ["a", "b"], '
    '"range": [1, 2.5e3, -4], "deep": {"x": null, "y": true, "z": "</tool_call>"}}}'
)

VALID: list[tuple[str, str, str, list[tuple[str, str]]]] = [
    # -- hermes (Qwen2.5 / Qwen3 / Hermes 2 Pro) --
    ("hermes", f'<tool_call>\n{{"name": "get_weather", "arguments": {PARIS}}}\n</tool_call>',
     "", [("get_weather", PARIS)]),
    ("hermes",
     "I'll check both for you.\n\n<tool_call>\n"
     f'{{"name": "get_weather", "arguments": {PARIS}}}\n</tool_call>\n<tool_call>\n'
     '{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}\n</tool_call>\n\n'
     "Let me know if you need more.",
     "I'll check both for you.\n\nLet me know if you need more.",
     [("get_weather", PARIS), ("get_time", '{"timezone": "Europe/Paris"}')]),
    ("hermes", f'<tool_call>\n{{"name": "search", "arguments": {NESTED}}}\n</tool_call>',
     "", [("search", NESTED)]),
    # stopped on "</tool_call>" as a stop string: the end tag is missing
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {}}', "", [("get_time", "{}")]),
    # arguments first, then the name; compact JSON; arguments as a JSON string
    ("hermes", '<tool_call>{"arguments":{"timezone":"UTC"},"name":"get_time"}</tool_call>',
     "", [("get_time", '{"timezone":"UTC"}')]),
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": "{\\"timezone\\": \\"UTC\\"}"}\n'
     "</tool_call>", "", [("get_time", '{"timezone": "UTC"}')]),
    # real newlines inside a string are written as escapes
    ("hermes", '<tool_call>\n{"name": "search", "arguments": {"query": "line1\nline2"}}\n</tool_call>',
     "", [("search", '{"query": "line1\\nline2"}')]),
    ("hermes", "No tools needed: 2 + 2 = 4 < 5.", "No tools needed: 2 + 2 = 4 < 5.", []),
    # -- llama3 (Llama 3.1 / 3.2 / 3.3 JSON) --
    ("llama3", '{"name": "get_weather", "parameters": {"location": "Paris, France", "unit": "celsius"}}',
     "", [("get_weather", PARIS)]),
    ("llama3", '<|python_tag|>{"name": "get_time", "parameters": {"timezone": "Asia/Tokyo"}}',
     "", [("get_time", '{"timezone": "Asia/Tokyo"}')]),
    ("llama3",
     f'{{"name": "get_weather", "parameters": {PARIS}}}; '
     '{"name": "get_time", "parameters": {"timezone": "Europe/Paris"}}',
     "", [("get_weather", PARIS), ("get_time", '{"timezone": "Europe/Paris"}')]),
    ("llama3", f'Let me look.<|python_tag|>{{"name": "search", "arguments": {NESTED}}}',
     "Let me look.", [("search", NESTED)]),
    ("llama3", '{"temperature": 21, "unit": "celsius"}', '{"temperature": 21, "unit": "celsius"}', []),
    ("llama3", "  The weather is {sunny}.", "  The weather is {sunny}.", []),
    # -- mistral (v3 tokenizer array form, and the v11 [ARGS] form) --
    ("mistral", f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {PARIS}}}]',
     "", [("get_weather", PARIS)]),
    ("mistral",
     f'Sure.[TOOL_CALLS] [{{"name": "get_weather", "arguments": {PARIS}}}, '
     '{"name": "search", "arguments": {"query": "météo"}}]',
     "Sure.", [("get_weather", PARIS), ("search", '{"query": "météo"}')]),
    ("mistral", f"[TOOL_CALLS]get_weather[ARGS]{PARIS}[TOOL_CALLS]get_time[CALL_ID]a1B2c3D4e[ARGS]{{}}",
     "", [("get_weather", PARIS), ("get_time", "{}")]),
    ("mistral", f'[TOOL_CALLS] [{{"name": "search", "arguments": {NESTED}}}]', "", [("search", NESTED)]),
    ("mistral", '[TOOL_CALLS] [{"name": "get_time", "arguments": {}}', "", [("get_time", "{}")]),
    # -- pythonic (Llama 3.2 / 3.3 / 4) --
    ("pythonic", '[get_weather(location="Paris, France", unit="celsius")]',
     "", [("get_weather", PARIS)]),
    ("pythonic", "[get_weather(location='Paris, France'), get_time(timezone=\"Europe/Paris\")]",
     "", [("get_weather", '{"location": "Paris, France"}'),
          ("get_time", '{"timezone": "Europe/Paris"}')]),
    ("pythonic",
     "[search(query=\"caf\\u00e9 \\\"au lait\\\" 東京)\", filters={'tags': ['a', 'b'], "
     "'range': (1, 2.5e3, -4), 'deep': {'x': None, 'y': True}})]",
     "", [("search", '{"query": "café \\"au lait\\" 東京)", "filters": {"tags": ["a", "b"], '
          '"range": [1, 2500.0, -4], "deep": {"x": null, "y": true}}}')]),
    # the closing bracket missing at the end (a stop string)
    ("pythonic", "[get_time(timezone='UTC')", "", [("get_time", '{"timezone": "UTC"}')]),
    ("pythonic", "<|python_start|>[get_time(timezone=\"UTC\")]<|python_end|>",
     "", [("get_time", '{"timezone": "UTC"}')]),
    ("pythonic", "See [1] and [2]. [get_time()]\nDone [x].",
     "See [1] and [2].\nDone [x].", [("get_time", "{}")]),
    # -- generic (templates without tools; llama.cpp's style) --
    ("generic", f'{{"tool_calls": [{{"name": "get_weather", "arguments": {PARIS}}}]}}',
     "", [("get_weather", PARIS)]),
    ("generic",
     f'{{"tool_calls": [{{"name": "get_weather", "arguments": {PARIS}}}, '
     '{"name": "get_time", "arguments": {}}]}',
     "", [("get_weather", PARIS), ("get_time", "{}")]),
    ("generic", '{"content": "Bonjour ! \\u00c7a va ? \\"Oui\\"\\n\\ud83d\\ude00 \\\\o/"}',
     'Bonjour ! Ça va ? "Oui"\n😀 \\o/', []),
    ("generic", '{"response": "It is sunny."}', "It is sunny.", []),
    ("generic", f'{{"tool_call": {{"name": "search", "arguments": {NESTED}}}}}', "", [("search", NESTED)]),
    ("generic", "I cannot answer in JSON.", "I cannot answer in JSON.", []),
]

MALFORMED: list[tuple[str, str]] = [
    ("hermes", '<tool_call>\n{"name": "delete_everything", "arguments": {}}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {"timezone": }}\n</tool_call> ok'),
    ("hermes", "<tool_call>\n<function=get_time>\n</function>\n</tool_call>"),
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "UTC"}}\n</tool_cell>'),
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": [1, 2]}\n</tool_call>'),
    ("hermes", '<tool_call>{"name": "get_time", "arguments": {"a": ' + "[" * 300),
    ("hermes", "text <tool_cal"),
    ("llama3", '{"name": "get_time", "parameters": {"timezone": "UTC"'),
    ("llama3", '{"name": "get_time", "parameters": {}, "extra": 1}'),
    ("llama3", '<|python_tag|>brave_search.call(query="weather")'),
    ("llama3", '{"name": "get_time", "parameters": {}}; {"bad": 1}'),
    ("mistral", "[TOOL_CALLS] I cannot call tools."),
    ("mistral", "[TOOL_CALLS]unknown_tool[ARGS]{}"),
    ("mistral", "[TOOL_CALLS]get_time[ARGZ]{}"),
    ("pythonic", '[get_time("UTC")]'),
    ("pythonic", "[get_time(timezone=UTC)]"),
    ("pythonic", "[launch_rockets(n=3)]"),
    ("pythonic", "[get_time(**{'a': 1})]"),
    ("generic", '{"tool_calls": [{"name": "get_time", "arguments": {}}'),
    ("generic", '{"answer": 42}'),
    ("generic", '{"content": 42}'),
    ("generic", '{"content": "a", "content": "b"}'),
    ("generic", "{}"),
]
# Malformed texts whose call broke after it began streaming: the stream showed the call.
BROKEN_LATE = {
    '<tool_call>{"name": "get_time", "arguments": {"a": ' + "[" * 300,
    '<tool_call>\n{"name": "get_time", "arguments": {"timezone": }}\n</tool_call> ok',
    '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "UTC"}}\n</tool_cell>',
    '{"name": "get_time", "parameters": {"timezone": "UTC"',
    '{"name": "get_time", "parameters": {}, "extra": 1}',
    '{"name": "get_time", "parameters": {}}; {"bad": 1}',
    '{"tool_calls": [{"name": "get_time", "arguments": {}}',
    '{"content": "a", "content": "b"}',
}

# The markup each format must never show in content (for the VALID texts).
MARKUP = {
    "hermes": ["<tool_call>", "</tool_call>"],
    "llama3": ["<|python_tag|>", '"parameters"'],
    "mistral": ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"],
    "pythonic": ["<|python_start|>", "<|python_end|>", "get_time(", "get_weather("],
    "generic": ['"tool_calls"', '"content"'],
}
