#!/usr/bin/env node
import { App, Validations } from 'aws-cdk-lib';
import { AwsSolutionsChecks } from 'cdk-nag';
import { LeaselockStack } from '../lib/leaselock-stack';

// Environment-agnostic: no AWS look-ups at synth time (the worker VPC takes the region's first two AZs).
// Context: routerCodeDir / reconcilerCodeDir (default ../target/lambda/<name>), workerImage.
const app = new App();
new LeaselockStack(app, 'Leaselock', {
  coordinator: {
    routerCodeDir: app.node.tryGetContext('routerCodeDir'),
    reconcilerCodeDir: app.node.tryGetContext('reconcilerCodeDir'),
  },
  workerImage: app.node.tryGetContext('workerImage'),
});
Validations.of(app).addPlugins(new AwsSolutionsChecks(app, { verbose: true }));
