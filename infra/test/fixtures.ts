import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { App, Validations } from 'aws-cdk-lib';
import { AwsSolutionsChecks } from 'cdk-nag';

/** Temporary directories this test process made; removed when it exits. */
const made: string[] = [];
process.on('exit', () => {
  for (const dir of made) fs.rmSync(dir, { recursive: true, force: true });
});

function tempDir(prefix: string): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  made.push(dir);
  return dir;
}

/** Placeholder bootstrap directories, so the tests run without building the Rust Lambdas. */
export function placeholderCodeDirs(): { routerCodeDir: string; reconcilerCodeDir: string } {
  const root = tempDir('leaselock-lambda-');
  const dir = (name: string): string => {
    fs.mkdirSync(path.join(root, name));
    fs.writeFileSync(path.join(root, name, 'bootstrap'), '');
    return path.join(root, name);
  };
  return { routerCodeDir: dir('router'), reconcilerCodeDir: dir('reconciler') };
}

/** An app that synthesizes into a temporary directory. */
export function testApp(): App {
  return new App({ outdir: tempDir('leaselock-cdk-') });
}

/** Synthesizes the app under the AwsSolutions pack; returns each violation as "rule at path". */
export function nagViolations(app: App): string[] {
  Validations.of(app).addPlugins(new AwsSolutionsChecks(app));
  let synthError: unknown;
  try {
    app.synth();
  } catch (error) {
    synthError = error; // a failed validation still writes its report
  }
  const reportPath = path.join(app.outdir, 'validation-report.json');
  if (!fs.existsSync(reportPath)) {
    throw synthError ?? new Error(`no validation report in ${app.outdir}`);
  }
  const report = JSON.parse(fs.readFileSync(reportPath, 'utf8')) as {
    pluginReports: Array<{ violations: Array<{ ruleName: string; violatingConstructs: Array<{ constructPath: string }> }> }>;
  };
  return report.pluginReports.flatMap((plugin) =>
    plugin.violations.flatMap((violation) =>
      violation.violatingConstructs.map((construct) => `${violation.ruleName} at ${construct.constructPath}`),
    ),
  );
}
