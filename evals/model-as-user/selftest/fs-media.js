// QuickJS has no atob: the decoded size follows from the base64 length and its padding.
const root = (await tools.mcp__filesystem__list_allowed_directories({})).content[0].text.split("\n").filter((l) => l.startsWith("/"))[0].trim();
const r = await tools.mcp__filesystem__read_media_file({ path: `${root}/assets/logo.png` });
const block = r.content.find((c) => c.type === "image");
const padding = (block.data.match(/=*$/) || [""])[0].length;
return { mimeType: block.mimeType, bytes: (block.data.length / 4) * 3 - padding };
