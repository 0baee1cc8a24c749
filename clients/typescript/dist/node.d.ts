/** A tar.gz of a directory's contents (paths relative to it; regular files and directories). */
export declare function tarDirectory(dir: string): Uint8Array;
