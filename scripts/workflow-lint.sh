#!/usr/bin/env bash
# Lint the GitHub Actions workflows with GitHub's own parser (@actions/workflow-parser,
# from the npm registry, pinned, cached in ~/.cache/leasehold/tools): schema, contexts
# and expressions. The workflows cannot run here; this is what can be checked.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/apt.sh
TOOLS=${LEASEHOLD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/leasehold}/tools/workflow-parser
PARSER=@actions/workflow-parser@0.3.61
command -v npm >/dev/null 2>&1 || apt_install npm
if [ ! -d "$TOOLS/node_modules/@actions/workflow-parser" ]; then
  mkdir -p "$TOOLS"
  (cd "$TOOLS" && npm install --silent --no-audit --no-fund "$PARSER" >&2)
fi
# The checker lives beside the package, so that its import resolves there.
cat > "$TOOLS/lint.mjs" <<'JS'
import { readFileSync } from "fs";
import { parseWorkflow, convertWorkflowTemplate, NoOperationTraceWriter } from "@actions/workflow-parser";
let failed = false;
for (const name of process.argv.slice(2)) {
  const parsed = parseWorkflow({ name, content: readFileSync(name, "utf8") }, new NoOperationTraceWriter());
  const template = await convertWorkflowTemplate(parsed.context, parsed.value);
  const errors = [...new Set([...parsed.context.errors.getErrors(), ...(template.errors || [])]
    .map((e) => e.message ?? e.Message ?? JSON.stringify(e)))];
  for (const e of errors) console.error(`${name}: ${e}`);
  if (errors.length) failed = true; else console.error(`[workflow-lint] ${name}: ok`);
}
process.exit(failed ? 1 : 0);
JS
# The package imports its JSON schemas without an import attribute, which Node 20
# refuses; a load hook adds it.
cat > "$TOOLS/json-hook.mjs" <<'JS'
export async function load(url, context, nextLoad) {
  if (url.endsWith(".json")) context = { ...context, importAttributes: { type: "json" } };
  return nextLoad(url, context);
}
JS
cat > "$TOOLS/register.mjs" <<'JS'
import { register } from "node:module";
register("./json-hook.mjs", import.meta.url);
JS
node --import "$TOOLS/register.mjs" "$TOOLS/lint.mjs" .github/workflows/*.yml
