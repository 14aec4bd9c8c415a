// The benches' command lines: opt(name, default) reads a valued flag, specs are the positional
// arguments (neither a flag nor the value of one of `valued`).
export function benchArgs(argv, valued = []) {
  const opt = (name, dflt) => {
    const i = argv.indexOf(name);
    return i >= 0 ? argv[i + 1] : dflt;
  };
  const specs = argv.filter((a, i) => !a.startsWith('--') && !valued.includes(argv[i - 1]));
  return { opt, specs };
}
