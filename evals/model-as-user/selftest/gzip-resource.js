// QuickJS has no btoa/atob: encode the text by hand, and size the result from its base64 length.
const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const base64 = (s) => {
  let out = "";
  for (let i = 0; i < s.length; i += 3) {
    const [a, b, c] = [s.charCodeAt(i), s.charCodeAt(i + 1), s.charCodeAt(i + 2)];
    const n = (a << 16) | ((b || 0) << 8) | (c || 0);
    out += alphabet[(n >> 18) & 63] + alphabet[(n >> 12) & 63] + (i + 1 < s.length ? alphabet[(n >> 6) & 63] : "=") + (i + 2 < s.length ? alphabet[n & 63] : "=");
  }
  return out;
};
const r = await tools.mcp__everything__gzip_file_as_resource({ data: "data:text/plain;base64," + base64("hello codemode"), outputType: "resource" });
const { resource } = r.content.find((c) => c.type === "resource");
const padding = (resource.blob.match(/=*$/) || [""])[0].length;
return { uri: resource.uri, mimeType: resource.mimeType, bytes: (resource.blob.length / 4) * 3 - padding };
