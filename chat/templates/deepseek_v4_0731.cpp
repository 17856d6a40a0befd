// deepseek-v4-0731: DeepSeek V4 Flash 0731's chat encoding. DeepSeek publishes
// it as Python (`encode_messages` in the checkpoint's encoding/encoding_dsv4.py),
// not as a Jinja template, so this text is Baton's own: a Jinja rendering of
// that encoder's steps, run by the same engine and the same path as every other
// template (tools, reasoning, the DSML output format). docs/CHAT_TEMPLATES.md,
// "DeepSeek V4 Flash 0731", lists what it renders and the choices it makes
// where the encoder leaves them to the server (request-level tools, OpenAI's
// effort names, Anthropic's thinking budget). The strings (markers, effort
// prompts, tools section) are the encoder's, byte for byte.
//
// The steps, in the encoder's order:
// 1. request-level tools (and a response_format variable) go to the first
//    message when it is a system message, else to a new empty system message
//    at the front;
// 2. tool messages become <tool_result> blocks of a user turn, and
//    consecutive user turns merge, the blocks joined by a blank line;
// 3. the tool results of a turn are put in the order of the preceding
//    assistant's tool calls (text blocks keep their places);
// 4. in thinking mode without tools, developer messages before the last
//    user turn are dropped, and so is every earlier turn's reasoning;
// 5. each message renders with the transition that follows it.
#include "chat/templates/builtin.h"

namespace baton {

std::string_view deepseek_v4_0731_template_text() {
  static constexpr std::string_view kText = R"jinja(
{%- set think_on = thinking if thinking is defined and thinking is not none else (enable_thinking if enable_thinking is defined and enable_thinking is not none else false) -%}
{%- set drop = drop_thinking if drop_thinking is defined and drop_thinking is not none else true -%}
{%- set gen_prompt = add_generation_prompt if add_generation_prompt is defined and add_generation_prompt is not none else true -%}
{%- set with_tools = tools is defined and tools is not none and tools | length > 0 -%}
{%- set with_format = response_format is defined and response_format is not none and response_format -%}
{%- set effort = reasoning_effort if reasoning_effort is defined and reasoning_effort is not none and reasoning_effort != '' else none -%}
{%- if effort is none and thinking_budget is defined and thinking_budget is number -%}
  {%- set effort = 'low' if thinking_budget < 8192 else ('high' if thinking_budget < 24576 else 'max') -%}
{%- endif -%}
{%- set effort_aliases = {'none': 'low', 'minimal': 'low', 'medium': 'high', 'xhigh': 'max'} -%}
{%- if effort is none -%}
  {%- set effort = 'low' -%}
{%- elif effort is string and effort in effort_aliases -%}
  {%- set effort = effort_aliases[effort] -%}
{%- endif -%}
{%- set effort_prompts = {
  'low': '',
  'high': 'Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n',
  'max': 'Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\nYou MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose the problem into its most fundamental components, trace every causal chain to its root, and resolve the underlying cause rather than any surface symptom.\nDo not stop reasoning until you have independently verified the solution from multiple angles and are certain that no assumption remains unchecked and no error remains undiscovered.\n\n'} -%}
{%- if not (effort is string and effort in effort_prompts) -%}
  {{- raise_exception('Invalid reasoning effort: ' ~ (effort | string) ~ ', expected one of low, high, max') -}}
{%- endif -%}
{%- set tools_text = namespace(schemas=[]) -%}
{%- if with_tools -%}
  {%- for tool in tools -%}
    {%- set tools_text.schemas = tools_text.schemas + [tool['function'] | tojson] -%}
  {%- endfor -%}
{%- endif -%}
{%- set tools_section = '## Tools\n\nYou have access to a set of tools to help answer the user\'s question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="$TOOL_NAME">\n<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name="$TOOL_NAME2">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\nString parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n' ~ (tools_text.schemas | join('\n')) ~ '\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n' -%}
{%- set attach = with_tools or with_format -%}
{%- set st = namespace(msgs=[]) -%}
{%- if attach and not (messages and messages[0]['role'] == 'system') -%}
  {%- set st.msgs = [{'role': 'system', 'msg': {'content': ''}, 'attached': true}] -%}
{%- endif -%}
{%- for m in messages -%}
  {%- set role = m['role'] -%}
  {%- set last = st.msgs[-1] if st.msgs else none -%}
  {%- if role == 'tool' or role == 'user' -%}
    {%- set text = m['content'] if m['content'] is string else '' -%}
    {%- if role == 'tool' -%}
      {%- set block = {'type': 'tool_result', 'id': (m['tool_call_id'] if m['tool_call_id'] is string else ''), 'text': text} -%}
    {%- else -%}
      {%- set block = {'type': 'text', 'text': text} -%}
    {%- endif -%}
    {%- if last is not none and last['role'] == 'user' -%}
      {%- set st.msgs = st.msgs[:-1] + [{'role': 'user', 'blocks': last['blocks'] + [block]}] -%}
    {%- else -%}
      {%- set st.msgs = st.msgs + [{'role': 'user', 'blocks': [block]}] -%}
    {%- endif -%}
  {%- else -%}
    {%- set st.msgs = st.msgs + [{'role': role, 'msg': m, 'attached': attach and loop.first and role == 'system'}] -%}
  {%- endif -%}
{%- endfor -%}
{%- set eff_drop = drop and not with_tools -%}
{%- if think_on and eff_drop -%}
  {%- set lu = namespace(idx=-1, kept=[]) -%}
  {%- for item in st.msgs -%}
    {%- if item['role'] in ['user', 'developer'] -%}{%- set lu.idx = loop.index0 -%}{%- endif -%}
  {%- endfor -%}
  {%- for item in st.msgs -%}
    {%- if item['role'] in ['user', 'system', 'tool', 'latest_reminder', 'direct_search_results', 'assistant'] or loop.index0 >= lu.idx -%}
      {%- set lu.kept = lu.kept + [item] -%}
    {%- endif -%}
  {%- endfor -%}
  {%- set st.msgs = lu.kept -%}
{%- endif -%}
{%- set lu = namespace(idx=-1) -%}
{%- for item in st.msgs -%}
  {%- if item['role'] in ['user', 'developer'] -%}{%- set lu.idx = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- set rs = namespace(calls=[]) -%}
{{- '<｜begin▁of▁sentence｜>' -}}
{%- for item in st.msgs -%}
  {%- set i = loop.index0 -%}
  {%- set role = item['role'] -%}
  {%- if i == 0 and think_on -%}{{- effort_prompts[effort] -}}{%- endif -%}
  {%- if role == 'system' -%}
    {{- item['msg']['content'] if item['msg']['content'] is string else '' -}}
    {%- if item['attached'] and with_tools -%}{{- '\n\n' ~ tools_section -}}{%- endif -%}
    {%- if item['attached'] and with_format -%}
      {{- '\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n' ~ (response_format | tojson) -}}
    {%- endif -%}
  {%- elif role == 'developer' -%}
    {%- if not (item['msg']['content'] is string and item['msg']['content']) -%}
      {{- raise_exception('Invalid message for role developer: it needs a content') -}}
    {%- endif -%}
    {{- '<｜User｜>' ~ item['msg']['content'] -}}
  {%- elif role == 'user' -%}
    {%- set srt = namespace(tools=[], any_id=false, parts=[], t=0) -%}
    {%- for b in item['blocks'] -%}
      {%- if b['type'] == 'tool_result' -%}{%- set srt.tools = srt.tools + [b] -%}{%- endif -%}
    {%- endfor -%}
    {%- for c in rs.calls -%}
      {%- if c['id'] is string and c['id'] -%}{%- set srt.any_id = true -%}{%- endif -%}
    {%- endfor -%}
    {%- if srt.tools | length > 1 and srt.any_id -%}
      {%- set unsorted = srt.tools -%}
      {%- set srt.tools = [] -%}
      {%- for k in range(rs.calls | length) -%}
        {%- for b in unsorted -%}
          {%- set key = namespace(v=0) -%}
          {%- for c in rs.calls -%}
            {%- if c['id'] is string and c['id'] and c['id'] == b['id'] -%}{%- set key.v = loop.index0 -%}{%- endif -%}
          {%- endfor -%}
          {%- if key.v == k -%}{%- set srt.tools = srt.tools + [b] -%}{%- endif -%}
        {%- endfor -%}
      {%- endfor -%}
    {%- endif -%}
    {%- for b in item['blocks'] -%}
      {%- if b['type'] == 'tool_result' -%}
        {%- set srt.parts = srt.parts + ['<tool_result>' ~ srt.tools[srt.t]['text'] ~ '</tool_result>'] -%}
        {%- set srt.t = srt.t + 1 -%}
      {%- else -%}
        {%- set srt.parts = srt.parts + [b['text']] -%}
      {%- endif -%}
    {%- endfor -%}
    {{- '<｜User｜>' ~ (srt.parts | join('\n\n')) -}}
  {%- elif role == 'latest_reminder' -%}
    {{- '<｜latest_reminder｜>' ~ (item['msg']['content'] if item['msg']['content'] is string else '') -}}
  {%- elif role == 'assistant' -%}
    {%- set m = item['msg'] -%}
    {%- set calls = m['tool_calls'] if m['tool_calls'] is defined and m['tool_calls'] else [] -%}
    {%- if calls -%}{%- set rs.calls = calls -%}{%- endif -%}
    {%- if think_on and ((not eff_drop) or i > lu.idx) -%}
      {{- (m['reasoning_content'] if m['reasoning_content'] is string else '') ~ '</think>' -}}
    {%- endif -%}
    {{- m['content'] if m['content'] is string else '' -}}
    {%- if calls -%}
      {%- set inv = namespace(list=[]) -%}
      {%- for c in calls -%}
        {%- set args = c['function']['arguments'] -%}
        {%- if args is string -%}
          {%- set args = {'arguments': args} -%}
        {%- elif args is not mapping -%}
          {%- set args = {} -%}
        {%- endif -%}
        {%- set ps = namespace(list=[]) -%}
        {%- for k, v in args.items() -%}
          {%- if v is string -%}
            {%- set ps.list = ps.list + ['<｜DSML｜parameter name="' ~ k ~ '" string="true">' ~ v ~ '</｜DSML｜parameter>'] -%}
          {%- else -%}
            {%- set ps.list = ps.list + ['<｜DSML｜parameter name="' ~ k ~ '" string="false">' ~ (v | tojson) ~ '</｜DSML｜parameter>'] -%}
          {%- endif -%}
        {%- endfor -%}
        {%- set inv.list = inv.list + ['<｜DSML｜invoke name="' ~ c['function']['name'] ~ '">\n' ~ (ps.list | join('\n')) ~ '\n</｜DSML｜invoke>'] -%}
      {%- endfor -%}
      {{- '\n\n<｜DSML｜tool_calls>\n' ~ (inv.list | join('\n')) ~ '\n</｜DSML｜tool_calls>' -}}
    {%- endif -%}
    {{- '<｜end▁of▁sentence｜>' -}}
  {%- else -%}
    {{- raise_exception('Unknown role: ' ~ (role | string)) -}}
  {%- endif -%}
  {%- set next_role = st.msgs[i + 1]['role'] if i + 1 < st.msgs | length else none -%}
  {%- if role in ['user', 'developer'] and (next_role in ['assistant', 'latest_reminder'] or (next_role is none and gen_prompt)) -%}
    {{- '<｜Assistant｜>' -}}
    {{- '<think>' if think_on and ((not eff_drop) or i >= lu.idx) else '</think>' -}}
  {%- endif -%}
{%- endfor -%}
)jinja";
  return kText;
}

}  // namespace baton
