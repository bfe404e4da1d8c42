// The API key, when the server has one: asked for once, kept in the browser, asked for again when refused.
import { ApiError, key } from "/webui/api.js";

const $ = (id) => document.getElementById(id);

let asking = null;
function askKey(message) {
  if (!asking) {
    asking = new Promise((resolve) => {
      $("key-message").textContent = message;
      $("key-input").value = "";
      $("key-dialog").showModal();
      const done = () => {
        key.set($("key-input").value.trim());
        $("key-dialog").close();
        $("key-ok").removeEventListener("click", done);
        asking = null;
        resolve();
      };
      $("key-ok").addEventListener("click", done);
      $("key-input").onkeydown = (e) => { if (e.key === "Enter") { e.preventDefault(); done(); } };
    });
  }
  return asking;
}

// Runs fn; a 401 asks for the key (saying when the one kept was refused) and tries again.
export async function withKey(fn) {
  for (;;) {
    try {
      return await fn();
    } catch (e) {
      if (!(e instanceof ApiError) || e.status !== 401) throw e;
      await askKey(key.get() ? "That key was not accepted: check the --api-key the server was started with."
        : "This server was started with --api-key: enter the key.");
    }
  }
}
