// A file the user gives the page (an attachment, the file being edited) as text, or why it cannot be.
const MAX_ATTACH_BYTES = 1 << 20;

export async function readText(file) {
  if (file.size > MAX_ATTACH_BYTES) throw new Error(`${file.name} is over 1 MB: attach a smaller text file`);
  const bytes = new Uint8Array(await file.arrayBuffer());
  try {
    if (bytes.includes(0)) throw new Error();
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw new Error(`${file.name} is not a text file: attach text or code (UTF-8)`);
  }
}
