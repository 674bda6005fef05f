"""A chat template in the shape of Qwen3-Coder's, for tests: ChatML turns, the tools listed in
the system turn with the `<function=…>` call format asked for, earlier calls written back as
`<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nvalue\\n</parameter>\\n…</function>\\n</tool_call>`
(a string value as it is, an object or array as JSON, anything else through `string`, as
Qwen's template writes them), and tool results as `<tool_response>` blocks in a user turn."""

QWEN3_CODER_TEMPLATE = """
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
    {{- 'You have access to the following functions:\\n\\n<tools>' }}
    {%- for tool in tools %}{{- '\\n' + tool | tojson }}{%- endfor %}
    {{- '\\n</tools>\\n\\nTo call a function, reply in this format:\\n\\n<tool_call>\\n' }}
    {{- '<function=example_function_name>\\n<parameter=example_parameter>\\nvalue\\n' }}
    {{- '</parameter>\\n</function>\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'assistant' and message.tool_calls %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}{{- '\\n' + message.content | trim + '\\n' }}{%- endif %}
        {%- for call in message.tool_calls %}
            {%- set call = call.function %}
            {{- '\\n<tool_call>\\n<function=' + call.name + '>\\n' }}
            {%- for key, value in call.arguments | items %}
                {{- '<parameter=' + key + '>\\n' }}
                {%- if value is mapping or (value is sequence and value is not string) %}
                    {{- value | tojson }}
                {%- else %}
                    {{- value | string }}
                {%- endif %}
                {{- '\\n</parameter>\\n' }}
            {%- endfor %}
            {{- '</function>\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or loop.previtem.role != 'tool' %}{{- '<|im_start|>user\\n' }}{%- endif %}
        {{- '<tool_response>\\n' + message.content + '\\n</tool_response>\\n' }}
        {%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- elif message.role != 'system' or not loop.first %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
