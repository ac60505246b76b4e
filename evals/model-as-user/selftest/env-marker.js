const r = await tools.mcp__everything__get_env({});
return JSON.parse(r.content[0].text).EVAL_MARKER;
