const [hit] = await searchTools("tiny image logo", { limit: 1 });
const r = await tools[hit.name]({});
const block = r.content.find((c) => c.type === "image");
image(block);
return block.mimeType;
