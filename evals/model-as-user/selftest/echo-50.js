const replies = await Promise.all(Array.from({ length: 50 }, (_, i) => tools.mcp__everything__echo({ message: `m${i}` })));
return replies.filter((r, i) => r.content[0].text.includes(`m${i}`)).length;
