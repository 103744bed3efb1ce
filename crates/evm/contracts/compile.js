// Compiles the contracts beside this file with solc-js and writes, per contract,
// build/NAME.init.hex (creation code), build/NAME.runtime.hex (deployed code) and
// build/NAME.abi.json. Run by compile.sh; the build and the tests only read the output.
const fs = require("fs");
const path = require("path");
const solc = require(process.argv[2] || "solc");

const here = __dirname;
const names = ["Token", "Kitties", "Lottery"];
const sources = {};
for (const name of names) {
  sources[`${name}.sol`] = { content: fs.readFileSync(path.join(here, `${name}.sol`), "utf8") };
}
const input = {
  language: "Solidity",
  sources,
  settings: {
    optimizer: { enabled: true, runs: 200 },
    evmVersion: "cancun",
    outputSelection: { "*": { "*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"] } },
  },
};
const output = JSON.parse(solc.compile(JSON.stringify(input)));
const errors = (output.errors || []).filter((e) => e.severity === "error");
if (errors.length > 0) {
  for (const e of errors) console.error(e.formattedMessage);
  process.exit(1);
}
fs.mkdirSync(path.join(here, "build"), { recursive: true });
for (const name of names) {
  const contract = output.contracts[`${name}.sol`][name];
  fs.writeFileSync(path.join(here, "build", `${name}.init.hex`), contract.evm.bytecode.object + "\n");
  fs.writeFileSync(path.join(here, "build", `${name}.runtime.hex`), contract.evm.deployedBytecode.object + "\n");
  fs.writeFileSync(path.join(here, "build", `${name}.abi.json`), JSON.stringify(contract.abi, null, 1) + "\n");
}
console.log(`compiled ${names.join(", ")} with solc ${solc.version()}`);
