"""Miniatures of real chat templates that TRL does not ship, each written here to keep the one
habit of its family that places an assistant turn otherwise than its prefixes, with the
family's special tokens; and tool conversations as users record them.

- Command-R7B (tool use): ``<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>`` written after every
  conversation, whatever it holds; an answer opens ``<|START_RESPONSE|>``, a call
  ``<|START_THINKING|>``; results grouped in one system turn.
- Phi-4-mini: calls as ``<|tool_call|>`` blocks, results as ``<|tool_response|>``; the end of text
  after the last message, the generation prompt instead of it.
- Mistral Nemo: the system message goes into the user turn that is the last message, and the
  tools before the last user message; call ids of 9 characters, checked.
- Mistral Small 3.2: a default system prompt naming today, the tools before the last user
  message, ``[TOOL_CALLS]name[ARGS]{...}`` after the content.
- QwQ: ChatML with Qwen's ``<tool_call>`` and ``<tool_response>`` blocks (results in a user turn),
  reasoning cut from earlier answers, and a generation prompt that opens ``<think>``.
- DeepSeek-V3.1: ``</think>`` opens an answer after a user turn, calls' arguments a JSON string,
  results as ``<｜tool▁output▁begin｜>`` blocks.
"""

from __future__ import annotations

import json

COMMAND_R7B = """{{ bos_token }}
{%- if messages and messages[0]['role']|lower == 'system' %}{% set preamble = messages[0]['content'] %}{% endif %}
{%- set calls = namespace(index=0) %}{% set seen = namespace(ids=[]) %}
<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|># System Preamble
You are Command, a model made to use tools.
{% if tools %}
## Available Tools
```json
[
{% for tool in tools %}
    {"name": "{{ tool['function']['name'] }}", "parameters": {{ tool['function']['parameters']|tojson }}}
{%- if not loop.last %},{% endif %}

{% endfor %}
]
```
{% endif %}
{%- if preamble %}

# Developer Preamble
{{ preamble }}
{%- endif -%}
<|END_OF_TURN_TOKEN|>
{%- for message in messages %}
    {%- if message.role|lower == 'system' and not (loop.first and preamble) %}
<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>{{ message.content }}<|END_OF_TURN_TOKEN|>
    {%- elif message.role|lower == 'user' %}
<|START_OF_TURN_TOKEN|><|USER_TOKEN|>{{ message.content }}<|END_OF_TURN_TOKEN|>
    {%- elif message.role|lower == 'assistant' %}
<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% if message.tool_calls %}<|START_THINKING|>{{ message.reasoning_content }}\
<|END_THINKING|><|START_ACTION|>[
    {% for call in message.tool_calls %}
    {"tool_call_id": "{{ calls.index }}", "tool_name": "{{ call['function']['name'] }}", \
"parameters": {{ call['function']['arguments']|tojson }}}{% if not loop.last %},{% endif %}

    {% set calls.index = calls.index + 1 %}
    {% endfor %}
]<|END_ACTION|><|END_OF_TURN_TOKEN|>{% else %}<|START_RESPONSE|>{{ message.content }}<|END_RESPONSE|>\
<|END_OF_TURN_TOKEN|>{% endif %}
    {% elif message.role|lower == 'tool' and message.tool_call_id not in seen.ids %}
<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TOOL_RESULT|>[
    {"tool_call_id": "{{ message.tool_call_id }}", "results": {"0": {{ message.content|tojson }}}}
    {%- for later in messages[loop.index0 + 1:] %}
        {%- if later.role|lower == 'tool' %},
    {"tool_call_id": "{{ later.tool_call_id }}", "results": {"0": {{ later.content|tojson }}}}
            {%- set seen.ids = seen.ids + [later.tool_call_id] %}
        {%- else %}{% break %}{% endif %}
    {%- endfor %}
]<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|>
    {%- endif %}
{%- endfor %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"""

PHI4_MINI = """{%- if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}
{%- elif tools is not none %}{% set system = '' %}{% endif %}
{%- if system is defined %}{{- '<|system|>' + system }}
    {%- for tool in tools or [] %}{{- '<|tool|>' + tool['function']|tojson + '<|/tool|>' }}{% endfor %}
    {{- '<|end|>' }}
{%- endif %}
{%- for message in messages %}
    {%- if message['role'] == 'tool' %}{{- '<|tool_response|>' + message['content']|tojson + '<|end|>' }}
    {%- elif message['role'] != 'system' %}{{- '<|' + message['role'] + '|>' }}
        {%- if message.content %}{{- message['content'] }}{% endif %}
        {%- for call in message.tool_calls or [] %}
            {{- '<|tool_call|>' + call['function']|tojson + '<|/tool_call|>' }}
        {%- endfor %}{{- '<|end|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|assistant|>' }}{% else %}{{- eos_token }}{% endif %}"""

MISTRAL_NEMO = """{%- if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}
    {%- set turns = messages[1:] %}{% else %}{% set turns = messages %}{% endif %}
{%- set users = turns | selectattr('role', 'equalto', 'user') | list %}
{{- bos_token }}
{%- for message in turns %}
    {%- if message['role'] == 'user' %}
        {%- if tools is not none and message == users[-1] %}{{- '[AVAILABLE_TOOLS][' }}
            {%- for tool in tools %}{{- tool|tojson }}{% if not loop.last %}{{- ', ' }}{% endif %}{% endfor %}
            {{- ']' }}{{- '[/AVAILABLE_TOOLS]' }}
        {%- endif %}
        {%- if loop.last and system is defined %}{{- '[INST]' + system + '\\n\\n' + message['content'] + '[/INST]' }}
        {%- else %}{{- '[INST]' + message['content'] + '[/INST]' }}{% endif %}
    {%- elif message.tool_calls is defined %}{{- '[TOOL_CALLS][' }}
        {%- for call in message.tool_calls %}{% set out = call.function|tojson %}{{- out[:-1] }}
            {%- if call.id is not defined or call.id|length != 9 %}
                {{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}
            {%- endif %}{{- ', "id": "' + call.id + '"}' }}
            {%- if not loop.last %}{{- ', ' }}{% else %}{{- ']' + eos_token }}{% endif %}
        {%- endfor %}
    {%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}
    {%- elif message['role'] == 'tool' %}
        {{- '[TOOL_RESULTS]{"content": ' + message['content']|string + ', "call_id": "' + message.tool_call_id
            + '"}[/TOOL_RESULTS]' }}
    {%- endif %}
{%- endfor %}"""

MISTRAL_SMALL_32 = """{%- set today = strftime_now('%Y-%m-%d') %}
{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}{% set turns = messages[1:] %}
{%- else %}{% set system = 'You are Mistral Small 3.2. Today is ' + today + '.' %}{% set turns = messages %}{% endif %}
{{- '[SYSTEM_PROMPT]' + system + '[/SYSTEM_PROMPT]' }}
{%- set users = turns | selectattr('role', 'equalto', 'user') | list %}
{%- for message in turns %}
    {%- if message['role'] == 'user' %}
        {%- if tools is not none and message == users[-1] %}{{- '[AVAILABLE_TOOLS]' + tools|tojson + '[/AVAILABLE_TOOLS]' }}
        {%- endif %}{{- '[INST]' + message['content'] + '[/INST]' }}
    {%- elif message['role'] == 'assistant' %}
        {%- if message['content'] %}{{- message['content'] }}{% endif %}
        {%- for call in message.tool_calls or [] %}{% set arguments = call['function']['arguments'] %}
            {%- if arguments is not string %}{% set arguments = arguments|tojson %}{% endif %}
            {{- '[TOOL_CALLS]' + call['function']['name'] + '[ARGS]' + arguments }}
        {%- endfor %}{{- eos_token }}
    {%- elif message['role'] == 'tool' %}{{- '[TOOL_RESULTS]' + message['content']|string + '[/TOOL_RESULTS]' }}
    {%- endif %}
{%- endfor %}"""

QWQ = """{%- if tools %}{{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{% endif %}
    {{- '# Tools\\n\\n<tools>' }}{% for tool in tools %}{{- '\\n' + tool|tojson }}{% endfor %}
    {{- '\\n</tools><|im_end|>\\n' }}
{%- elif messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}{% set content = message.content.split('</think>')[-1].lstrip('\\n') %}
        {{- '<|im_start|>assistant\\n' + content }}
        {%- for call in message.tool_calls or [] %}{% set call = call.function %}
            {%- if loop.first and content %}{{- '\\n' }}{% elif not loop.first %}{{- '\\n' }}{% endif %}
            {{- '<tool_call>\\n{"name": "' + call.name + '", "arguments": ' + call.arguments|tojson + '}\\n</tool_call>' }}
        {%- endfor %}{{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{% endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{% endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"""

DEEPSEEK_V31 = """{%- set ns = namespace(system='', last_user=false, tool=false, first=false) %}
{%- for message in messages if message['role'] == 'system' %}{% set ns.system = ns.system + message['content'] %}
{%- endfor %}{{ bos_token }}{{ ns.system }}
{%- for message in messages %}
    {%- if message['role'] == 'user' %}{% set ns.tool = false %}{% set ns.last_user = true %}
        {{- '<｜User｜>' + message['content'] }}
    {%- elif message['role'] == 'assistant' and message['tool_calls'] is defined %}
        {%- if ns.last_user %}{{- '<｜Assistant｜></think>' }}{% endif %}
        {%- set ns.last_user = false %}{% set ns.tool = false %}{{- message['content'] }}
        {%- for call in message['tool_calls'] %}{% if loop.first %}{{- '<｜tool▁calls▁begin｜>' }}{% endif %}
            {{- '<｜tool▁call▁begin｜>' + call['function']['name'] + '<｜tool▁sep｜>' + call['function']['arguments']
                + '<｜tool▁call▁end｜>' }}
        {%- endfor %}{{- '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>' }}
    {%- elif message['role'] == 'assistant' %}
        {%- if ns.last_user %}{{- '<｜Assistant｜></think>' }}{% endif %}{% set ns.last_user = false %}
        {%- set ns.tool = false %}{{- message['content'].split('</think>')[-1] + '<｜end▁of▁sentence｜>' }}
    {%- elif message['role'] == 'tool' %}{% set ns.last_user = false %}{% set ns.tool = true %}
        {{- '<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt and ns.last_user and not ns.tool %}{{- '<｜Assistant｜></think>' }}{% endif %}"""

# Each family: its template, its special tokens (the last the end of text a turn closes with, the
# config's eos_token), the config's bos_token, and whether a call's arguments are a JSON string.
FAMILIES = {
    "command_r7b": (COMMAND_R7B, ("<BOS_TOKEN>", "<|START_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|USER_TOKEN|>",
                                  "<|CHATBOT_TOKEN|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_THINKING|>",
                                  "<|END_THINKING|>", "<|START_ACTION|>", "<|END_ACTION|>", "<|START_TOOL_RESULT|>",
                                  "<|END_TOOL_RESULT|>", "<|END_OF_TURN_TOKEN|>"), "<BOS_TOKEN>", False),
    "phi4_mini": (PHI4_MINI, ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|/tool|>", "<|tool_call|>",
                              "<|/tool_call|>", "<|tool_response|>", "<|end|>", "<|endoftext|>"), None, False),
    "mistral_nemo": (MISTRAL_NEMO, ("<s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                                    "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "</s>"), "<s>", False),
    "mistral_small_32": (MISTRAL_SMALL_32, ("<s>", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[INST]", "[/INST]",
                                            "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[ARGS]",
                                            "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "</s>"), "<s>", False),
    "qwq": (QWQ, ("<|im_start|>", "<|im_end|>"), None, False),
    "deepseek_v31": (DEEPSEEK_V31, ("<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>",
                                    "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
                                    "<｜tool▁calls▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
                                    "<｜end▁of▁sentence｜>"), "<｜begin▁of▁sentence｜>", True),
}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def tool_conversations(text_arguments: bool = False) -> list[dict]:
    """Tool use as users record it: one call, two in a row, content beside a call, calls in
    parallel, several user turns; with a system message or not, ``tools`` given or not. Call ids
    are 9 characters (Mistral's rule); arguments a JSON string where ``text_arguments``."""
    def call(name, city, i):
        arguments = {"city": city}
        return {"type": "function", "id": f"call{i:05d}", "function": {
            "name": name, "arguments": json.dumps(arguments) if text_arguments else arguments}}

    def result(text, i):
        return {"role": "tool", "content": text, "tool_call_id": f"call{i:05d}"}

    found = []
    for system in (False, True):
        for tools in (False, True):
            for kind in ("one", "two", "content", "parallel", "users"):
                turns = [{"role": "system", "content": "You are helpful."}] if system else []
                first = {"role": "assistant", "content": "Let me check." if kind == "content" else "",
                         "tool_calls": [call("get_weather", "Paris", 0)]}
                if kind == "parallel":
                    first["tool_calls"].append(call("get_time", "Lyon", 1))
                turns += [{"role": "user", "content": "Weather in Paris?"}, first,
                          result('{"temperature": 20}', 0)]
                if kind == "parallel":
                    turns.append(result('{"time": "noon"}', 1))
                if kind == "two":
                    turns += [{"role": "assistant", "content": "", "tool_calls": [call("get_time", "Nice", 1)]},
                              result('{"time": "noon"}', 1)]
                turns.append({"role": "assistant", "content": "It is 20 degrees in Paris."})
                if kind == "users":
                    turns += [{"role": "user", "content": "And Rome?"},
                              {"role": "assistant", "content": "", "tool_calls": [call("get_weather", "Rome", 2)]},
                              result('{"temperature": 25}', 2), {"role": "assistant", "content": "25 in Rome."}]
                found.append({"messages": turns, **({"tools": [WEATHER]} if tools else {})})
    return found
