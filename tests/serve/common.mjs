// What the serving client scripts share: their `--flag value` arguments, a
// check that throws, and the exit with the error on stderr.

// Parses process.argv: `flags` maps each accepted flag to the key it sets
// (numbers: a key ending in "#" stores Number(value) under the name without
// it); `defaults` gives the starting values. Throws on an unknown flag or a
// missing value.
export function parseArgs(flags, defaults = {}) {
  const a = { ...defaults };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    const [k, v] = [argv[i], argv[i + 1]];
    if (v === undefined) throw new Error(`missing value for ${k}`);
    const key = flags[k];
    if (key === undefined) throw new Error(`unknown option ${k}`);
    if (key.endsWith("#")) a[key.slice(0, -1)] = Number(v);
    else a[key] = v;
  }
  return a;
}

export function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

// Runs main; a throw is printed with the script's name and exits 1.
export function run(name, main) {
  main().catch((e) => {
    process.stderr.write(`${name}: ${e.stack || e}\n`);
    process.exit(1);
  });
}
