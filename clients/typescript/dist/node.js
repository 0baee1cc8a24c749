// Node.js only: a local directory as a tar.gz archive, for createWorkspace and uploadArchive.
import { readdirSync, readFileSync, lstatSync } from "node:fs";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
function header(name, size, mode, type, mtime) {
    const h = new Uint8Array(512);
    const enc = new TextEncoder();
    let path = enc.encode(name), prefix = new Uint8Array();
    if (path.length > 100) {
        const cut = name.lastIndexOf("/", 155);
        if (cut <= 0 || enc.encode(name.slice(cut + 1)).length > 100)
            throw new RangeError(`path ${name} is too long for a tar archive (255 bytes at most)`);
        prefix = enc.encode(name.slice(0, cut));
        path = enc.encode(name.slice(cut + 1));
    }
    const put = (off, s) => h.set(typeof s === "string" ? enc.encode(s) : s, off);
    const oct = (n, len) => n.toString(8).padStart(len - 1, "0") + "\0";
    put(0, path);
    put(100, oct(mode, 8));
    put(108, oct(0, 8));
    put(116, oct(0, 8));
    put(124, oct(size, 12));
    put(136, oct(mtime, 12));
    put(148, "        ");
    put(156, type);
    put(257, "ustar\0");
    put(263, "00");
    put(345, prefix);
    let sum = 0;
    for (const b of h)
        sum += b;
    put(148, sum.toString(8).padStart(6, "0") + "\0 ");
    return h;
}
/** A tar.gz of a directory's contents (paths relative to it; regular files and directories). */
export function tarDirectory(dir) {
    const parts = [];
    const walk = (rel) => {
        for (const entry of readdirSync(join(dir, rel)).sort()) {
            const name = rel ? `${rel}/${entry}` : entry;
            const st = lstatSync(join(dir, name));
            const mtime = Math.floor(st.mtimeMs / 1000);
            if (st.isDirectory()) {
                parts.push(header(name + "/", 0, 0o755, "5", mtime));
                walk(name);
            }
            else if (st.isFile()) {
                const data = readFileSync(join(dir, name));
                parts.push(header(name, data.length, st.mode & 0o777, "0", mtime), data);
                if (data.length % 512)
                    parts.push(new Uint8Array(512 - (data.length % 512)));
            }
        }
    };
    if (!lstatSync(dir).isDirectory())
        throw new TypeError(`${dir} is not a directory`);
    walk("");
    parts.push(new Uint8Array(1024));
    return new Uint8Array(gzipSync(Buffer.concat(parts)));
}
